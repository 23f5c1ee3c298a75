"""Named query-side adapters under $KVLINK_RAG_HOME/links: listing, loading, per-query choice, no re-encoding."""

from __future__ import annotations

import pytest
import torch

from factories import save_adapter, tiny_text_engine
from kvlink_rag.adapter_registry import AdapterVariants, UnknownAdapter, adapter_names, check_name, find_adapter
from kvlink_rag.linking.link_tokens import LinkTokensMismatch, bundled_adapters
from kvlink_rag.types import Document


def test_names_are_checked_and_listed(tmp_path):
    for bad in ("", "../x", "a/b", "none", "default", "kvlink-rag", "x" * 65, "-lead"):
        with pytest.raises(ValueError):
            check_name(bad)
    (tmp_path / "tenant-a.safetensors").write_bytes(b"")
    (tmp_path / "none.safetensors").write_bytes(b"")  # reserved: not listed as an artifact
    (tmp_path / "kvlink-rag.safetensors").write_bytes(b"")  # the served model's id on the OpenAI routes: not listed
    (tmp_path / "notes.txt").write_text("x")
    assert adapter_names(tmp_path) == ["default", "none", "tenant-a"]
    assert adapter_names(tmp_path / "missing") == ["default", "none"]


def test_switching_adapters_changes_the_answer_but_never_re_encodes(tmp_path):
    engine = tiny_text_engine(tmp_path, kv_dtype="float32")
    links = tmp_path / "links"
    save_adapter(engine, links, "a", seed=1)
    save_adapter(engine, links, "b", seed=2)
    variants = AdapterVariants(engine, links)
    docs = [Document("The lamp at Skerry Point was kept by Ada Quill."), Document("Paris lies on the Seine.")]
    for d in docs:
        engine.get_or_encode(d)
    stored = {engine.cache_key(d): engine.cache.get(engine.cache_key(d)).keys.clone() for d in docs}
    calls = []
    original = type(engine).encode
    engine.encode = lambda d: calls.append(d) or original(engine, d)  # any re-encoding would be seen here

    def logits(name):
        eng = variants.get(name)
        ctx, hits = eng.link_context("Who kept the lamp?", docs)
        assert hits == 2
        return ctx.last_logits

    a, b, none = logits("a"), logits("b"), logits("none")
    assert variants.get("a").link_tokens.k == 3 and variants.get("a").adapter is not None
    assert variants.get("none").adapter is None and variants.get(None) is engine
    assert not torch.allclose(a, b) and not torch.allclose(a, none)
    assert torch.equal(logits("a"), a)  # memoised variant, same result
    assert calls == [] and all(torch.equal(engine.cache.get(k).keys, v) for k, v in stored.items())


def test_unknown_and_foreign_adapters_fail_clearly(tmp_path):
    engine = tiny_text_engine(tmp_path)
    links = tmp_path / "links"
    save_adapter(engine, links, "other-model", fingerprint="f" * 64)
    variants = AdapterVariants(engine, links)
    with pytest.raises(UnknownAdapter, match="unknown adapter 'nope'; available: default, none, other-model"):
        variants.get("nope")
    with pytest.raises(UnknownAdapter):
        variants.get("../../etc/passwd")
    with pytest.raises(LinkTokensMismatch, match="made for model ffffffffffff"):
        variants.get("other-model")


def test_resident_adapters_are_bounded_and_a_rewritten_file_replaces_its_copy(tmp_path):
    engine = tiny_text_engine(tmp_path, kv_dtype="float32")
    links = tmp_path / "links"
    names = [f"n{i}" for i in range(6)]
    for i, name in enumerate(names):
        save_adapter(engine, links, name, seed=10 + i)
    base = set(engine.lm.adapters)  # the default engine's own LoRA (if any) is never evicted
    variants = AdapterVariants(engine, links, max_loaded=2)
    docs = [Document("The lamp at Skerry Point was kept by Ada Quill.")]

    def logits(name):
        ctx, _ = variants.get(name).link_context("Who kept the lamp?", docs)
        return ctx.last_logits

    def resident():
        return engine.lm.adapters - base

    first = {name: logits(name) for name in names}
    assert len(resident()) == 2 and variants.loaded() == ["n4", "n5"]
    assert torch.equal(logits("n0"), first["n0"])  # evicted, reloaded from its file: the same output
    assert len(resident()) == 2 and variants.loaded() == ["n5", "n0"]
    assert not torch.allclose(first["n0"], first["n1"])

    for k in (4, 5, 6):  # rewritten three times (another K each time): one copy, the newest
        save_adapter(engine, links, "n5", k=k, seed=20 + k)
        assert variants.get("n5").link_tokens.k == k
        assert len(resident()) == 2 and variants.loaded() == ["n0", "n5"]
    assert variants.get("default") is engine and base <= engine.lm.adapters


def test_bundled_adapters_are_offered_for_their_model_and_a_users_file_of_the_name_wins(tmp_path):
    engine = tiny_text_engine(tmp_path, kv_dtype="float32")
    shipped, links = tmp_path / "shipped", tmp_path / "links"
    save_adapter(engine, shipped, "lookup", seed=3)
    save_adapter(engine, shipped, "foreign", fingerprint="f" * 64)  # another model's: not offered
    (shipped / "broken.safetensors").write_bytes(b"not safetensors")  # unreadable: not offered
    bundled = bundled_adapters(engine.lm.fingerprint, shipped)
    assert bundled == {"lookup": shipped / "lookup.safetensors"}
    variants = AdapterVariants(engine, links, bundled=bundled)
    assert variants.names() == ["default", "none", "lookup"]
    assert find_adapter(links, "lookup", bundled) == shipped / "lookup.safetensors"
    docs = [Document("The lamp at Skerry Point was kept by Ada Quill.")]

    def logits(name):
        ctx, _ = variants.get(name).link_context("Who kept the lamp?", docs)
        return ctx.last_logits

    from_package = logits("lookup")
    assert variants.get("lookup").link_tokens.k == 3 and not torch.allclose(from_package, logits("none"))
    own = save_adapter(engine, links, "lookup", k=4, seed=4)  # the user's file of the same name replaces it
    assert find_adapter(links, "lookup", bundled) == own
    assert variants.get("lookup").link_tokens.k == 4 and not torch.allclose(logits("lookup"), from_package)
    assert variants.names() == ["default", "none", "lookup"]
    with pytest.raises(UnknownAdapter, match="available: default, none, lookup"):
        variants.get("foreign")


def test_the_package_offers_no_bundled_adapter_to_another_model(tmp_path):
    engine = tiny_text_engine(tmp_path)
    assert AdapterVariants(engine, tmp_path / "links").names() == ["default", "none"]
    with pytest.raises(UnknownAdapter, match="'lookup' ships with kvlink-rag for another model, not for this one"):
        AdapterVariants(engine, tmp_path / "links").get("lookup")
    with pytest.raises(UnknownAdapter, match="unknown adapter 'nope'; available: default, none$"):
        AdapterVariants(engine, tmp_path / "links").get("nope")


def test_a_name_is_checked_against_files_and_shipped_adapters_before_any_model_loads(tmp_path):
    from kvlink_rag.adapter_names import check_known

    links, shipped = tmp_path / "links", tmp_path / "shipped"
    links.mkdir()
    shipped.mkdir()
    (links / "mine.safetensors").write_bytes(b"")
    (shipped / "lookup.safetensors").write_bytes(b"")  # shipped for some model: known by name here
    assert [check_known(links, n, shipped) for n in ("default", "none", "mine", "lookup")] == ["default", "none", "mine", "lookup"]
    with pytest.raises(UnknownAdapter, match="unknown adapter 'nope'; available: default, none, lookup, mine"):
        check_known(links, "nope", shipped)
    with pytest.raises(ValueError, match="invalid adapter name"):
        check_known(links, "../x", shipped)

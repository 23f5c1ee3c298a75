"""Reuse methods behind one interface: the request's recompute ratio picks one; each is its function."""

from __future__ import annotations

import pytest
import torch

from factories import random_ids, tiny_model
from kvlink_rag.linking.document_prefill import encode_document, encode_prefix
from kvlink_rag.linking.linker import link
from kvlink_rag.reuse.blend import blend
from kvlink_rag.reuse.methods import METHODS, CacheBlend, LinkTokens, ReuseInputs, reuse_method


def _inputs(lm) -> ReuseInputs:
    prefix = encode_prefix(lm, random_ids(4, 9))
    ids = [random_ids(n, seed=n) for n in (12, 7)]
    docs = [encode_document(lm, i, kv_dtype="float32", prefix=prefix) for i in ids]
    links = torch.randn(3, lm.config.hidden_size, generator=torch.Generator().manual_seed(1)) * 0.02
    return ReuseInputs(lm, prefix, docs, ids, links, random_ids(5, 3), anchored=True)


def test_the_recompute_ratio_picks_the_method():
    assert isinstance(reuse_method(0.0), LinkTokens)
    assert reuse_method(0.3) == CacheBlend(0.3)
    assert set(METHODS) == {"link-tokens", "cacheblend"}


def test_a_method_is_selectable_by_its_registered_name(monkeypatch):
    from kvlink_rag.reuse import methods

    assert reuse_method(0.0, "cacheblend") == CacheBlend(0.0)
    assert isinstance(reuse_method(0.3, "link-tokens"), LinkTokens)
    monkeypatch.setitem(methods.METHODS, "blend-twice", lambda ratio: CacheBlend(2 * ratio))
    assert reuse_method(0.2, "blend-twice") == CacheBlend(0.4)
    assert reuse_method(0.2) == CacheBlend(0.2)  # the default rule is unchanged by a new registration
    with pytest.raises(ValueError, match="unknown reuse method 'nope'; choose one of blend-twice, cacheblend, link-tokens"):
        reuse_method(0.0, "nope")


@torch.inference_mode()
def test_each_method_is_its_function():
    lm = tiny_model("llama")
    x = _inputs(lm)
    got = LinkTokens().context(x).last_logits
    ref = link(lm, x.prefix, x.docs, x.link_embeds, x.question_ids, anchored=True, new_tokens=1).last_logits
    assert torch.equal(got, ref)
    got = CacheBlend(0.5).context(x).last_logits
    ref = blend(lm, x.prefix, x.docs, x.doc_ids, x.link_embeds, x.question_ids, recompute_ratio=0.5,
                new_tokens=1).last_logits
    assert torch.equal(got, ref)


def test_a_registered_method_is_what_the_scheduler_runs(tmp_path, monkeypatch):
    """The batching scheduler takes a linked request's prefill from its method's ``scheduled`` (a method that
    adds nothing to the prefill answers as link tokens do)."""
    import threading

    from factories import tiny_text_engine
    from kvlink_rag.reuse import methods
    from kvlink_rag.runtime.gen_request import GenRequest
    from kvlink_rag.runtime.limits import SchedulerLimits
    from kvlink_rag.runtime.prefix_tree import PrefixTree
    from kvlink_rag.runtime.scheduler import Scheduler
    from kvlink_rag.types import Document

    seen = []

    class Counting(LinkTokens):
        def scheduled(self, inputs):
            seen.append((inputs.start, inputs.pending.num_tokens, len(inputs.docs)))
            return super().scheduled(inputs)

    monkeypatch.setitem(methods.METHODS, "link-tokens", lambda ratio: Counting())
    engine = tiny_text_engine(tmp_path, max_new_tokens=4, kv_dtype="float32")
    docs = [Document("The code word is kiwi.", "A"), Document("The number is seven.", "B")]
    ids = engine.template.question_ids(engine.lm.tokenizer, "what is the code word?").tolist()
    sched = Scheduler(engine.lm, PrefixTree(0), threading.Lock(), SchedulerLimits())
    try:
        h = sched.submit(GenRequest(lambda: engine, docs, ids, engine.sampling(), "linked"))
        assert list(h.tokens()) == engine.answer("what is the code word?", docs).token_ids
    finally:
        sched.close()
    assert len(seen) == 1 and seen[0][2] == 2 and seen[0][1] > 0

"""Chunking rules (pure, with a word-count tokenizer) and long documents through the engine (tiny model,
real tokenizer): chunks link like the same texts given as documents, edits re-encode one chunk, short
documents are untouched."""

from __future__ import annotations

import random

import pytest
import torch

from factories import tiny_text_engine
from kvlink_rag.cache import MemoryCache
from kvlink_rag.text.chunking import Chunker, chunk_text, closes_run, pack, runs, split_units
from kvlink_rag.types import Document

WORDS = ("harbour lantern granite meadow falcon copper willow ember quarry saddle orchard tidal basalt "
         "ferry glacier thistle lagoon beacon marble cinder").split()


def count(text: str) -> int:
    """Words plus a 4-token frame (a stand-in tokenizer)."""
    return len(text.split()) + 4


def paragraphs(n: int, seed: int, lo: int = 15, hi: int = 70) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))) + "." for _ in range(n)]


def test_short_text_is_one_chunk_and_long_text_splits_within_budget_and_concatenates():
    assert chunk_text("a b c", count, 64) == ["a b c"]
    text = "\n\n".join(paragraphs(40, seed=1))
    chunks = chunk_text(text, count, 128)
    assert len(chunks) > 5 and "".join(chunks) == text
    assert all(count(c) <= 128 for c in chunks)
    assert chunk_text(text, count, 128) == chunks  # deterministic


def test_an_overlong_paragraph_splits_at_sentences_then_at_whitespace():
    sentences = [" ".join(["falcon"] * 30) + "." for _ in range(8)]
    text = " ".join(sentences) + " " + " ".join(["granite"] * 300)  # one paragraph, a 300-word sentence
    chunks = chunk_text(text, count, 100)
    assert "".join(chunks) == text and all(count(c) <= 100 for c in chunks)
    units = split_units(text, count, 100)
    assert units[0] == sentences[0] + " " and all(count(u) <= 100 for u in units)
    with pytest.raises(ValueError, match="at least 64"):
        chunk_text(text, count, 32)


def _chunks(paras: list[str]) -> list[str]:
    return chunk_text("\n\n".join(paras), count, 128)


def test_a_one_paragraph_edit_changes_only_the_chunks_of_its_own_run():
    """Every paragraph edited in turn (one word replaced): exactly one chunk changes unless the edit flips
    whether the paragraph closes its run or the run is packed into several chunks; never a chunk outside
    the edited paragraph's run."""
    paras = paragraphs(40, seed=2)
    before = _chunks(paras)
    units = split_units("\n\n".join(paras), count, 128)
    exact = 0
    for i, p in enumerate(paras):
        edited = paras[:i] + [p.replace(p.split()[0], "EDITED", 1)] + paras[i + 1:]
        after = _chunks(edited)
        changed = [c for c in after if c not in before]
        unit = units[i]
        new_unit = edited[i] + unit[len(p):]
        flips = closes_run(unit, count(unit), 128) != closes_run(new_unit, count(new_unit), 128)
        run = next(r for r in runs(units, count, 128) if any(u is unit for u in r))
        packed = len(pack(run, count, 128)) > 1
        if not flips and not packed:
            assert len(changed) == 1 and "EDITED" in changed[0]
            exact += 1
        assert all("EDITED" in c or any(c.startswith(u) for u in run) or flips for c in changed)
        assert len(after) - len(changed) >= len(before) - 3  # the rest of the document kept its chunks
    assert exact >= 20  # most edits are the simple case


def test_chunker_keeps_title_numbers_chunks_and_leaves_short_documents_alone():
    chunker = Chunker(lambda text, title: count(text), 128)
    short = Document("a short text", "T")
    assert chunker(short) == [short]
    long = Document("\n\n".join(paragraphs(20, seed=3)), "Atlas")
    parts = chunker(long)
    assert len(parts) > 2 and [p.chunk for p in parts] == list(range(len(parts)))
    assert {p.title for p in parts} == {"Atlas"} and "".join(p.text for p in parts) == long.text
    assert chunker(parts[1]) == [parts[1]]  # a chunk is never chunked again
    assert Chunker(lambda text, title: count(text), 0)(long) == [long]
    assert {p.context for p in parts} == {None}  # chunks encoded alone
    in_context = Chunker(lambda text, title: count(text), 128, context=1)(long)
    assert [p.text for p in in_context] == [p.text for p in parts]
    assert [p.context for p in in_context] == [None] + [p.text for p in parts[:-1]]
    two = Chunker(lambda text, title: count(text), 128, context=2)(long)
    assert [p.context for p in two] == [None] + ["".join(p.text for p in parts[max(0, i - 2):i])
                                                 for i in range(1, len(parts))]


# -- through the engine (tiny random model, real tokenizer) ------------------------------------------------
LONG = Document("\n\n".join(paragraphs(24, seed=4, lo=10, hi=40)), "Field notes")
SHORT = Document("The ferry leaves the harbour at noon.", "Ferry")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """Chunks encoded in context of the text of one chunk before, each framed and followed by link tokens (the
    defaults, 'cache' / 'last' / 'first', are tested in test_chunk_past and test_joined_chunks)."""
    return tiny_text_engine(tmp_path_factory.mktemp("chunks"), max_new_tokens=4, chunk_tokens=128,
                            chunk_context_from="text", chunk_links="each", chunk_frames="each")


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """Chunks encoded alone."""
    return tiny_text_engine(tmp_path_factory.mktemp("alone"), max_new_tokens=4, chunk_tokens=128,
                            chunk_context=0)


class CountingCache(MemoryCache):
    """A memory cache that counts the KV bytes put into it."""

    def __init__(self):
        super().__init__()
        self.written = 0

    def put(self, key, kv):
        self.written += kv.nbytes
        return super().put(key, kv)


@pytest.mark.parametrize("which", ["alone", "engine"], ids=["alone", "in-context"])
def test_long_document_links_exactly_as_its_chunks_given_as_documents(which, request):
    engine = request.getfixturevalue(which)
    chunks = engine.chunks(LONG)
    assert len(chunks) >= 3 and all(engine.document_ids(c).numel() <= 128 for c in chunks)
    plain = [Document(c.text, c.title, context=c.context) for c in chunks]  # short documents: not chunked again
    a, hits_a = engine.link_context("where is the ferry?", [SHORT, LONG])
    b, hits_b = engine.link_context("where is the ferry?", [SHORT] + plain)
    assert torch.equal(a.last_logits, b.last_logits) and hits_b == len(chunks) + 1
    assert torch.equal(engine.prompt_ids("q?", [LONG]), engine.prompt_ids("q?", plain))


def test_short_documents_are_bit_identical_with_chunking_on_and_off(engine, tmp_path):
    off = tiny_text_engine(tmp_path, max_new_tokens=4, chunk_tokens=0)
    on = tiny_text_engine(tmp_path, max_new_tokens=4, chunk_tokens=128)
    assert on.chunks(SHORT) == [SHORT] and on.cache_keys(SHORT) == [on.cache_key(SHORT)]
    a, _ = on.link_context("when does it leave?", [SHORT, SHORT])
    b, _ = off.link_context("when does it leave?", [SHORT, SHORT])
    assert torch.equal(a.last_logits, b.last_logits)
    assert off.chunks(LONG) == [LONG]


def test_a_chunk_in_context_is_keyed_by_its_text_and_the_text_before_it(engine, alone):
    ctx, solo = engine.chunks(LONG), alone.chunks(LONG)
    assert engine.cache_key(ctx[0]) == alone.cache_key(solo[0])  # the first chunk has no context
    assert all(engine.cache_key(c) != alone.cache_key(s) for c, s in zip(ctx[1:], solo[1:]))
    other = Document(ctx[1].text, ctx[1].title, chunk=1, context="Another text before it.")
    assert engine.cache_key(other) != engine.cache_key(ctx[1])
    kv_ctx, kv_solo = engine.encode(ctx[1]), alone.encode(solo[1])
    assert torch.equal(kv_ctx.token_ids, kv_solo.token_ids) and not torch.equal(kv_ctx.values, kv_solo.values)


def test_an_edit_re_encodes_the_changed_chunk_and_the_one_after_it_in_context(engine):
    eng = engine.with_link_tokens(engine.link_tokens)
    eng.cache = CountingCache()
    encoded = []
    encode = eng.encode
    eng.encode = lambda d: encoded.append(d) or encode(d)
    eng.warm(LONG)
    paras = LONG.text.split("\n\n")
    edited = Document("\n\n".join(paras[:10] + [paras[10] + " EDITED"] + paras[11:]), LONG.title)
    before, after = set(eng.cache_keys(LONG)), eng.cache_keys(edited)
    assert len(set(after) - before) == 2  # the edited chunk (not the last) and the chunk after it
    encoded.clear()
    ctx, hits = eng.link_context("what was edited?", [edited])
    assert [("EDITED" in d.text, "EDITED" in (d.context or "")) for d in encoded] == [(True, False), (False, True)]
    assert hits == len(after) - 2


def test_an_edit_re_encodes_only_the_changed_chunk(alone):
    engine = alone
    eng = engine.with_link_tokens(engine.link_tokens)
    eng.cache = CountingCache()
    encoded = []
    encode = eng.encode
    eng.encode = lambda d: encoded.append(d) or encode(d)
    assert not eng.warm(LONG)
    first, total = len(encoded), eng.cache.written
    paras = LONG.text.split("\n\n")
    edited = Document("\n\n".join(paras[:10] + [paras[10] + " EDITED"] + paras[11:]), LONG.title)
    before, after = set(eng.cache_keys(LONG)), eng.cache_keys(edited)
    assert len(set(after) - before) == 1  # this edit moves no boundary
    encoded.clear()
    eng.cache.written = 0
    ctx, hits = eng.link_context("what was edited?", [edited])
    assert [("EDITED" in d.text) for d in encoded] == [True] and hits == len(after) - 1
    assert 0 < eng.cache.written < total / 2 and first == len(before)


def test_the_batching_scheduler_links_chunked_documents_like_the_one_request_path(engine):
    from service.verify import verify

    [agree] = verify(engine, [("where is the ferry?", [LONG, SHORT])], max_new_tokens=3)
    assert agree.max_abs_logit_diff < 1e-3 and agree.greedy_agree


def test_an_edit_after_a_paragraphs_head_rarely_moves_a_boundary():
    """Appending a word to each paragraph in turn: the run decisions hash the paragraph's head, so nearly
    every such edit changes exactly one chunk."""
    paras = paragraphs(40, seed=5)
    before = _chunks(paras)
    ones = sum(len([c for c in _chunks(paras[:i] + [p + " EDITED"] + paras[i + 1:]) if c not in before]) == 1
               for i, p in enumerate(paras))
    assert ones >= 36


def test_explain_sums_a_chunked_documents_chunks_into_one_entry(engine):
    from kvlink_rag.explain.answers import explain_answer

    ans, att = explain_answer(engine, "where is the ferry?", [SHORT, LONG], max_new_tokens=2)
    n_chunks = len(engine.chunks(LONG))
    assert n_chunks > 1 and len(att.documents) == 2
    assert abs(att.prefix + sum(d.share for d in att.documents) - 1.0) < 1e-4
    assert att.documents[1].token_mass.numel() == sum(engine.document_ids(c).numel() for c in engine.chunks(LONG))
    body = LONG.text
    assert att.documents[1].passages and all(0 <= a < b <= len(body) for a, b, _ in att.documents[1].passages)

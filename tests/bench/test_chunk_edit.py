"""bench-edit on a tiny model: chunked, a one-paragraph edit encodes one chunk (two in context); one block,
everything."""

from __future__ import annotations

import random

import pytest

from bench.chunk_edit import markdown, measure
from factories import tiny_text_engine
from evaluation.nq import NQExample
from kvlink_rag.types import Document

WORDS = "harbour lantern granite meadow falcon copper willow ember quarry saddle orchard tidal basalt".split()


@pytest.mark.parametrize("context", [False, True], ids=["alone", "in-context"])
def test_an_edit_re_encodes_one_chunk_against_the_whole_block(tmp_path, context):
    """Chunks encoded alone: the edited chunk only; in context of one chunk's text: it and the chunk after it."""
    rng = random.Random(0)
    examples = [NQExample(f"q{i}", ("a",), Document(" ".join(rng.choice(WORDS) for _ in range(rng.randint(15, 40))) + ".",
                                                    f"Passage {i}")) for i in range(40)]
    engine = tiny_text_engine(tmp_path, chunk_context=int(context), **({"chunk_context_from": "text"} if context else {}))
    r = measure(engine, examples, target_tokens=900, chunk_tokens=128, log=lambda m: None)
    c, b, n = r["chunked_edit"], r["one_block_edit"], 1 + context
    assert 700 < r["document_tokens"] <= 900 and r["chunked_first"]["encoded"] == c["chunks"] > 3
    assert c["encoded"] == n and c["tokens"] <= 128 * n and b["encoded"] == 1 and b["tokens"] > r["document_tokens"]
    assert c["bytes"] * 2 < b["bytes"] and r["stability"]["edits"] == r["paragraphs"]
    assert r["stability"]["mean_changed"] >= n - 0.25 and r["chunk_context"] == context
    assert "| one block | 1 of 1 |" in markdown(r) and ("in context" in markdown(r)) is context
    chunked_only = markdown({k: v for k, v in r.items() if k != "one_block_edit"})  # --parts chunked
    assert "| one block | 1 of 1 | - | - | - |" in chunked_only and "nan" not in chunked_only
    block_only = markdown({k: v for k, v in r.items() if k not in ("chunked_first", "chunked_edit")})  # --parts block
    assert "edited (a sentence appended)." in block_only and "encoded alone" not in block_only


def test_from_the_caches_an_edit_re_encodes_its_chunk_and_every_chunk_after_it(tmp_path):
    rng = random.Random(0)
    examples = [NQExample(f"q{i}", ("a",), Document(" ".join(rng.choice(WORDS) for _ in range(rng.randint(15, 40))) + ".",
                                                    f"Passage {i}")) for i in range(40)]
    engine = tiny_text_engine(tmp_path, chunk_context=1)  # the default: from the caches
    r = measure(engine, examples, target_tokens=900, chunk_tokens=128, log=lambda m: None, parts=("chunked",))
    c, first = r["chunked_edit"], r["chunked_first"]
    assert first["encoded"] == c["chunks"] > 3 and first["tokens"] < r["document_tokens"] + 128  # each chunk once
    assert 1 < c["encoded"] < c["chunks"] and r["chunk_context_from"] == "cache"  # the edited chunk and the rest
    assert "read, not recomputed" in markdown(r)

"""bench-edit on a tiny model: chunked, a one-paragraph edit encodes one chunk; one block, everything."""

from __future__ import annotations

import random

from bench.chunk_edit import markdown, measure
from factories import tiny_text_engine
from evaluation.nq import NQExample
from kvlink_rag.types import Document

WORDS = "harbour lantern granite meadow falcon copper willow ember quarry saddle orchard tidal basalt".split()


def test_an_edit_re_encodes_one_chunk_against_the_whole_block(tmp_path):
    rng = random.Random(0)
    examples = [NQExample(f"q{i}", ("a",), Document(" ".join(rng.choice(WORDS) for _ in range(rng.randint(15, 40))) + ".",
                                                    f"Passage {i}")) for i in range(40)]
    r = measure(tiny_text_engine(tmp_path), examples, target_tokens=900, chunk_tokens=128, log=lambda m: None)
    c, b = r["chunked_edit"], r["one_block_edit"]
    assert 700 < r["document_tokens"] <= 900 and r["chunked_first"]["encoded"] == c["chunks"] > 3
    assert c["encoded"] == 1 and c["tokens"] <= 128 and b["encoded"] == 1 and b["tokens"] > r["document_tokens"]
    assert c["bytes"] * 4 < b["bytes"] and r["stability"]["edits"] == r["paragraphs"]
    assert "| one block | 1 of 1 |" in markdown(r)

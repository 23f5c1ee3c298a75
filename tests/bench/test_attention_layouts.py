"""The attention-layout benchmark: every candidate computes the same attention as the contiguous buffer."""

from __future__ import annotations

from bench.attention_layouts import attention_layouts, markdown


def test_every_layout_matches_contiguous_attention_for_decode_and_prefill_chunks():
    rows = attention_layouts([200], [16, 64], repeats=1, log=lambda m: None)
    layouts = ["contiguous", "prefix pieces (5)", "blocks 16, gathered", "blocks 16, per block",
               "blocks 64, gathered", "blocks 64, per block", "pool 16, one run", "pool 16, scattered"]
    assert [(r["step"], r["layout"]) for r in rows] == [(s, name) for s in ("decode", "prefill chunk") for name in layouts]
    assert all(r["max_diff"] < 1e-5 and r["us_per_layer"] > 0 for r in rows)
    assert all(r["vs_contiguous"] == 1.0 for r in rows if r["layout"] == "contiguous")
    assert "| decode | 200 | blocks 64, per block |" in markdown(rows)

"""The long-prefill interference bench on a tiny model: every row filled, the markdown shows each."""

from __future__ import annotations

import pytest

from bench.prefill_interference import UNCHUNKED, markdown, prefill_interference
from factories import NQ_PATH, tiny_text_engine


def test_rows_for_the_cap_no_cap_and_unchunked(tmp_path):
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    from evaluation.nq import load_nq

    engine = tiny_text_engine(tmp_path, max_document_tokens=1024)
    examples = load_nq(NQ_PATH, limit=110)  # the long document starts at example 100
    res = prefill_interference(engine, examples, long_tokens=300, samples=1, step_tokens=32, long_prefill_budget=16,
                               log=lambda m: None)
    assert res["full_prompt_document_tokens"] >= 300
    assert [(r["step_tokens"], r["long_prefill_budget"]) for r in res["rows"]] == [(32, 16), (32, 0), (UNCHUNKED, 0)]
    for r in res["rows"]:
        assert r["busy_answer_p50_s"] >= r["busy_ttft_p50_s"] > 0 and r["idle_answer_p50_s"] >= r["idle_ttft_p50_s"] > 0
        assert r["ratio"] > 0 and r["answer_ratio"] > 0 and r["full_request_s"] > 0
    text = markdown(res)
    assert "| unchunked | none |" in text and "| 32 | 16 |" in text

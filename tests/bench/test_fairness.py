"""The fairness benchmark on a tiny model: every policy's row is filled and the table renders."""

from __future__ import annotations

from bench.fairness import fairness_section, fairness_suite
from factories import tiny_text_engine


def test_fairness_suite_runs_every_policy_and_reports(tmp_path):
    engine = tiny_text_engine(tmp_path, max_new_tokens=2)
    res = fairness_suite(engine, [], window_s=1.0, gap_s=0.1, long_tokens=300, long_clients=3, max_running=2,
                         sizes=(8, 40, 120), max_new_tokens=2, drain_s=60.0, log=lambda m: None)
    setup = res["setup"]
    assert setup["short_arrivals"] == 10 and sum(setup["arrival_sizes"].values()) == 10
    assert list(res["policies"]) == ["fifo", "buckets", "fair"]
    for row in res["policies"].values():
        assert row["short_requests"] == row["short_finished"] == 10  # all drained well within 60 s
        assert 0 < row["short_ttft_p50_s"] <= row["short_ttft_p99_s"] <= row["short_e2e_p99_s"]
        assert row["short_e2e_p50_s"] <= row["short_e2e_p99_s"] and row["long_finished"] >= 0
    text = "\n".join(fairness_section({"fairness": res}))
    assert "| fair |" in text and "| fifo |" in text and "10/10" in text

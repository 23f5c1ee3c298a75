"""The benchmark suite end to end on a tiny model: every table is filled with sane values."""

from __future__ import annotations

import pytest

from bench.report import markdown
from bench.run import run_suite
from factories import NQ_PATH, tiny_text_engine


def test_suite_runs_and_reports(tmp_path):
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    engine = tiny_text_engine(tmp_path)
    res = run_suite(engine, NQ_PATH, lengths=[300], repeats=1, doc_counts=[1, 2], store_sizes=[20], clients=[1, 2],
                    log=lambda m: None, requests=10, suites=("ttft", "bandwidth", "precompute", "scaling", "concurrency"))
    [row] = res["ttft"]
    assert row["context_tokens"] > 300 and row["full"]["median_s"] > 0 and row["linked_host"]["total"]["median_s"] > 0
    assert row["floor"]["kv_bytes"] > 0 and row["linked_over_floor"] > 0
    bw = res["bandwidth"]
    assert set(bw) == {"bfloat16", "int8"} and bw["int8"]["bytes_per_token"] < bw["bfloat16"]["bytes_per_token"]
    assert 0.9 < res["precompute"]["tokens"] / 4000 < 1.5
    assert [r["documents"] for r in res["scaling_documents"]] == [1, 2]
    assert res["scaling_store"][0]["entries"] == 20 and res["scaling_store"][0]["store_bytes"] > 0
    assert [r["clients"] for r in res["concurrency"]] == [1, 2] and res["concurrency"][1]["requests"] == 10
    assert res["concurrency"][0]["hit_rate"] == 1.0
    text = markdown(res, "kvlink-rag bench (test)")
    assert "## Concurrency" in text and "| 20 |" in text


def test_serving_workloads_run_and_report(tmp_path):
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    from bench.dialogues import dialogues
    from bench.interference import precompute_interference
    from bench.serving_nq import nq_throughput
    from evaluation.nq import load_nq

    engine = tiny_text_engine(tmp_path)
    engine.cache = None
    examples = load_nq(NQ_PATH, limit=300)
    res = {"nq": nq_throughput(engine, examples, [1, 2], new_tokens=4, log=lambda m: None),
           "dialogues": dialogues(engine, examples, n_dialogues=2, turns=2, docs=2, new_tokens=3, log=lambda m: None),
           "interference": precompute_interference(engine, examples, long_tokens=600, samples=2, log=lambda m: None)}
    assert [(r["clients"], r["scheduler"]) for r in res["nq"]["rows"]] == [(1, True), (2, True), (2, False)]
    assert all(r["throughput_rps"] > 0 and r["p99_s"] >= r["p50_s"] > 0 for r in res["nq"]["rows"])
    assert res["nq"]["floor"]["total_gflop"] > 0 and res["nq"]["floor"]["floor_rps"] > 0
    d = res["dialogues"]
    assert d["shared"]["turns"] == 4 and d["shared"]["cached_token_share"] > d["unshared"]["cached_token_share"]
    assert d["shared"]["peak_kv_bytes"] > 0 and d["unshared"]["peak_kv_bytes"] > 0
    assert res["interference"]["samples"] >= 1 and res["interference"]["idle_p50_s"] > 0
    text = markdown({"machine": {"platform": "p", "threads": 1, "device": "cpu", "model": "tiny", "kv_dtype": "bfloat16",
                                 "link_k": 5, "encoding": "anchored"}, "started": "now", "serving": res}, "bench (test)")
    assert "## Serving: batching scheduler" in text and "## Serving: 16 concurrent" in text


def test_workload_keeps_the_class_shares_and_every_class():
    import random

    from bench.concurrency import workload

    plan = workload(32, random.Random(0))
    assert [plan.count(c) for c in ("short", "medium", "long")] == [19, 10, 3]
    assert plan != sorted(plan, key=["short", "medium", "long"].index)  # shuffled
    assert sorted(workload(10, random.Random(1))) == sorted(["short"] * 6 + ["medium"] * 3 + ["long"])


def test_documents_for_budget_stay_near_the_budget(tmp_path):
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    from bench.contexts import documents_for_budget
    from evaluation.nq import load_nq

    engine = tiny_text_engine(tmp_path)
    examples = load_nq(NQ_PATH)[:200]
    for budget in (1000, 8000):
        docs = documents_for_budget(engine, examples, 10, budget)
        tokens = [len(engine.lm.tokenizer(d.text, add_special_tokens=False)["input_ids"]) for d in docs]
        assert len(docs) == 10 and all(0.97 * budget // 10 <= n <= budget // 10 + 2 for n in tokens), tokens


def test_dialogues_refuse_too_few_examples_before_building_anything():
    from bench.dialogues import dialogues

    with pytest.raises(ValueError, match="need 10 examples .the warm-up's included., not 9"):
        dialogues(None, [object()] * 9, n_dialogues=2, turns=3, docs=1)

"""The shared-tier benchmark end to end on a tiny checkpoint: TTFT from memory, local LMDB and the shared Redis
tier, both load bandwidths against the copy floor, and precompute with 1 and 2 worker processes."""

from __future__ import annotations

import pytest

from bench.bandwidth import copy_floor
from bench.report import markdown
from bench.shared_tier import shared_tier_suite
from factories import NQ_PATH
from evaluation.nq import load_nq
from service.settings import Settings
from service.runtime import load_engine
from service_support import save_tiny_checkpoint


def test_shared_tier_suite_runs_and_reports(tmp_path):
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    model = save_tiny_checkpoint(tmp_path / "tiny")
    engine = load_engine(Settings(home=tmp_path / "home", model=str(model), device="cpu", torch_threads=1), None)
    examples = load_nq(NQ_PATH)
    res = shared_tier_suite(engine, examples, examples[0].question, tmp_path / "bench", repeats=1,
                            context_tokens=300, precompute_docs=2, workers=[1, 2], log=lambda m: None)
    if "skipped" in res:
        pytest.skip(res["skipped"])
    t = res["ttft"]
    assert t["context_tokens"] > 300 and t["kv_bytes"] > 0 and t["shared_over_local"] > 0
    assert all(t[k]["total"]["median_s"] > 0 for k in ("memory", "local_warm", "shared_cold"))
    assert set(t["bandwidth"]) == {"shared", "local"} and all(b["copy_gbps"] > 0 for b in t["bandwidth"].values())
    assert t["bandwidth"]["shared"]["raw_fetch_gbps"] > 0
    assert [p["workers"] for p in res["precompute"]] == [1, 2] and res["precompute"][0]["speedup"] == 1.0
    assert res["precompute"][0]["tokens"] == res["precompute"][1]["tokens"] > 0
    assert all(0 < p["cores_used"] <= p["workers"] + 0.5 for p in res["precompute"])
    text = markdown({"machine": {"platform": "p", "threads": 1, "device": "cpu", "model": "tiny", "kv_dtype": "bfloat16",
                                 "link_k": 5, "encoding": "anchored"}, "started": "now", "shared_tier": res}, "bench")
    assert "Shared / local TTFT" in text and "| 2 |" in text


def test_the_copy_floor_copies_every_byte_into_touched_buffers():
    import torch

    timing = copy_floor([torch.ones(1000, dtype=torch.bfloat16), torch.zeros(10, 10)], repeats=2)
    assert timing.n == 2 and timing.median > 0

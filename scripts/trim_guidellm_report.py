"""Trim a guidellm JSON report to what :func:`bench.guidellm_sweep.parse_report` reads (the test fixture
``tests/bench/fixtures/guidellm-report.json`` was made so from a run against this server):
``python scripts/trim_guidellm_report.py REPORT.json OUT.json``."""

from __future__ import annotations

import json
import sys

METRICS = ("requests_per_second", "time_to_first_token_ms", "inter_token_latency_ms", "output_tokens_per_second",
           "output_token_count")


def trim(report: dict) -> dict:
    out = []
    for b in report["benchmarks"]:
        m = b["metrics"]
        kept = {"request_totals": m["request_totals"]}
        for name in METRICS:
            s = m[name]["successful"]
            kept[name] = {"successful": {"mean": s["mean"], "median": s["median"],
                                         "percentiles": {p: s["percentiles"][p] for p in ("p50", "p99")}}}
        out.append({"config": {"strategy": b["config"]["strategy"]}, "metrics": kept})
    return {"benchmarks": out}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        trimmed = trim(json.load(f))
    with open(sys.argv[2], "w") as f:
        json.dump(trimmed, f, indent=1)

"""``kvlink-rag bench --suites routing-sim``: the router's policies side by side on the model-free simulated fleet
(:mod:`bench.routing_sim`) of the issue's setup, under each service model and scenario, over several query
seeds, beside the analytic bounds (:mod:`bench.routing_bounds`)."""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

from bench.routing_bounds import bounds, ttft_bounds
from bench.routing_sim import Setup, Workload, simulate
from bench.routing_sim_fleet import ENCODE, FETCH, ServiceModel
from bench.routing_sim_variants import with_home
from bench.routing_workload import zipf_queries

POLICIES: dict[str, dict] = {
    "round-robin": {"policy": "round-robin"},
    "least-load": {"policy": "least-load"},
    "prefix-only": {"policy": "prefix-only"},
    "document-aware, no load floor (before)": {"policy": "document-aware", "load_floor": False},
    "document-aware": {"policy": "document-aware"},
    "document-aware + rendezvous home (what-if)": {"policy": "document-aware", "rank": with_home(1.0)},
}
"""Rows: label -> router settings (:class:`router.settings.RouterSettings` fields), and ``rank``: a ranking to
use in place of :func:`router.scoring.document_aware` (:mod:`bench.routing_sim_variants`)."""

SCENARIOS: dict[str, int | None] = {"steady": None, "restart": 2500}
"""Runs: label -> :attr:`bench.routing_sim.Setup.restart_at` (the last replica restarts, its tier emptied,
before that query; None: never)."""


def summarize(rows: list[dict]) -> dict:
    """One policy's runs (one per seed) in one row: medians of the hit rates and TTFTs (seconds), their
    ranges, and the worst ``max_min_load``; ``seeds``: the runs themselves."""
    out: dict = {"seeds": rows, "max_min_load": max(r["max_min_load"] for r in rows)}
    for key in ("hit_rate_docs", "hit_rate_tokens", "ttft_p50_s", "ttft_p99_s"):
        values = [r[key] for r in rows]
        out[key], out[key + "_range"] = statistics.median(values), [min(values), max(values)]
    return out


def routing_sim_suite(nq_path: Path | None = None, tokenizer_file: Path | None = None, n_docs: int = 1000,
                      n_queries: int = 5000, docs_per_query: int = 10, setup: Setup | None = None,
                      models: tuple[ServiceModel, ...] = (FETCH, ENCODE), policies: dict[str, dict] | None = None,
                      scenarios: dict[str, int | None] | None = None, seeds: tuple[int, ...] = (0, 1, 2),
                      log=print) -> dict:
    """Every policy under every service model and scenario, one run per query seed: ``{setup, bounds, runs:
    {scenario: {model name: {model, policies: {label: summarize(...)}}}}, ttft_bounds: {model name: ...}}``. Documents: the first ``n_docs`` NQ
    gold passages at ``nq_path`` (token counts: :func:`bench.routing_workload.passage_tokens`), or 140 tokens
    each without a file; the same documents and questions for every seed."""
    setup = setup or Setup()
    tokens, questions, source = _documents(nq_path, tokenizer_file, n_docs)
    works = [Workload(tokens, zipf_queries(n_docs, n_queries, docs_per_query, seed=s), questions) for s in seeds]
    out = {"setup": {"replicas": setup.replicas, "documents": n_docs, "corpus_tokens": sum(tokens),
                     "token_counts": source, "queries": n_queries, "warmup": setup.warmup, "seeds": list(seeds),
                     "docs_per_query": docs_per_query, "zipf": 1.0, "clients": setup.clients,
                     "host_fraction": setup.host_fraction, "host_tier_bytes": setup.host_bytes(tokens),
                     "poll_s": setup.poll_s},
           "bounds": bounds(tokens, docs_per_query, setup.replicas, setup.host_fraction), "runs": {}}
    for scenario, restart_at in (SCENARIOS if scenarios is None else scenarios).items():
        run = out["runs"][scenario] = {}
        for model in models:
            rows = {}
            for label, settings in (policies or POLICIES).items():
                log(f"routing-sim: {scenario}, {model.name}: {label}")
                rows[label] = summarize([simulate(w, replace(setup, restart_at=restart_at), model, settings)
                                         for w in works])
            run[model.name] = {"model": vars(model), "policies": rows}
    out["ttft_bounds"] = {m.name: ttft_bounds(out["bounds"], m.fixed_ms, m.hit_us, m.miss_us) for m in models}
    return out


def _documents(nq_path: Path | None, tokenizer_file: Path | None, n_docs: int) -> tuple[list[int], list[str], str]:
    """``(tokens per document, questions, how the tokens were counted)``."""
    if nq_path is None or not Path(nq_path).exists():
        return [140] * n_docs, [], "140 tokens each (no NQ file)"
    from bench.routing_workload import passage_tokens
    from evaluation.nq import load_nq

    examples = load_nq(nq_path, limit=n_docs)
    if len(examples) < n_docs:
        raise ValueError(f"{nq_path} holds {len(examples)} passages, fewer than {n_docs}")
    tokens, source = passage_tokens(examples, tokenizer_file)
    return tokens, [e.question for e in examples], f"NQ gold passages, {source}"

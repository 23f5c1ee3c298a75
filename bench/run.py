"""Run the benchmark suite and write JSON, plots and BENCHMARKS.md tables (issue 6)."""

from __future__ import annotations

import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from evaluation.nq import load_nq
from kvlink_rag.engine import Engine
from store.factory import open_store
from store.tiers.tier_fill import TIER_FILLER

from .bandwidth import bytes_per_token, load_bandwidth, stream_into_blocks
from .contexts import documents_for_budget
from .prefill_throughput import precompute_throughput
from .scaling import store_scaling, ttft_by_documents
from .ttft import drop_page_cache, first_decode_step, physical_floor, ttft_full, ttft_linked


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


SUITES = ("ttft", "bandwidth", "precompute", "scaling", "concurrency", "serving", "shared", "routing", "routing-sim",
          "fairness", "guidellm")
"""Benchmark groups ``kvlink-rag bench --suites`` can pick (default all)."""

MODEL_FREE = ("routing-sim",)
"""Suites that load no model (:func:`run_model_free` runs them alone)."""


def tokenizer_file(settings) -> Path:
    """Where the configured model's ``tokenizer.json`` is (it may not exist: the default model not fetched yet)."""
    from kvlink_rag.model.convert import MODEL_DIRNAME
    from kvlink_rag.settings import DEFAULT_MODEL

    folder = settings.models_dir / MODEL_DIRNAME if settings.model == DEFAULT_MODEL else Path(settings.model).expanduser()
    return folder / "tokenizer.json"


def run_model_free(nq_path: Path, tokenizer: Path | None, log=_stderr, suites: tuple[str, ...] = MODEL_FREE) -> dict:
    """The model-free ``suites`` (:data:`MODEL_FREE`) without an engine; the results dict as :func:`run_suite`'s
    (``machine``: the platform only). ``tokenizer``: a ``tokenizer.json`` to count the NQ passages' tokens."""
    return {"machine": {"platform": platform.platform(), "model": None}, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            **_model_free(nq_path, tokenizer, suites, log)}


def _model_free(nq_path: Path, tokenizer: Path | None, suites: tuple[str, ...], log) -> dict:
    """``routing_sim``: the router's policies on a simulated fleet (:mod:`bench.routing_sim_suite`)."""
    if "routing-sim" not in suites:
        return {}
    from .routing_sim_suite import routing_sim_suite

    return {"routing_sim": routing_sim_suite(nq_path, tokenizer, log=log)}


def run_suite(engine: Engine, nq_path: Path, lengths: list[int], repeats: int, doc_counts: list[int],
              store_sizes: list[int], clients: list[int] | None = None, log=_stderr, requests: int = 32,
              suites: tuple[str, ...] = SUITES) -> dict:
    """The ``suites`` side by side in one process; returns the results dict.

    ``requests``: HTTP queries per concurrency level (at least one per client). ``log`` gets the progress
    lines (default: stderr; stdout carries only results)."""
    examples = load_nq(nq_path)
    question = examples[0].question
    results: dict = {"machine": {"platform": platform.platform(), "threads": torch.get_num_threads(),
                                 "device": str(engine.lm.device), "model": engine.settings.model,
                                 "kv_dtype": engine.settings.kv_dtype, "link_k": engine.settings.link_k,
                                 "encoding": engine.settings.encoding},
                     "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    with tempfile.TemporaryDirectory(prefix="kvlink-bench-") as tmp:
        st = open_store(engine.settings.model_copy(update={"home": Path(tmp), "store_max_bytes": 16 << 30,
                                                           "host_cache_bytes": 8 << 30}))
        engine.cache = st.cache
        if "ttft" in suites:
            results["ttft"] = _ttft_rows(engine, st, examples, question, lengths, repeats, log)
        docs = documents_for_budget(engine, examples, 10, 4000, start=1000)
        if "bandwidth" in suites:
            log("load bandwidth")
            results["bandwidth"] = _bandwidth(engine, st, docs, repeats)
        if "precompute" in suites:
            log("precompute throughput")
            results["precompute"] = precompute_throughput(engine, st.blobs, docs)
        if "scaling" in suites:
            log("scaling with documents")
            pool = documents_for_budget(engine, examples, max(doc_counts), 130 * max(doc_counts), start=1200)
            results["scaling_documents"] = ttft_by_documents(engine, question, pool, doc_counts, repeats)
            log("scaling with stored entries")
            results["scaling_store"] = store_scaling(Path(tmp), store_sizes)
        if "shared" in suites:
            from .shared_tier import shared_tier_suite

            results["shared_tier"] = shared_tier_suite(engine, examples, question, Path(tmp) / "shared", repeats,
                                                       log=log)
        results.update(_fairness_and_routing(engine, examples, nq_path, Path(tmp), suites, log))
    if set(suites) & set(MODEL_FREE):
        results.update(_model_free(nq_path, tokenizer_file(engine.settings), suites, log))
    engine.cache = None  # the runtimes below give each request its tenant's store cache
    if clients and "concurrency" in suites:
        from .concurrency import concurrency

        log("concurrency through the HTTP API")
        results["concurrency"] = concurrency(engine, examples, clients, requests=requests)
    if clients and "serving" in suites:
        from .serving import serving_suite

        log("serving: batching scheduler and prefix sharing")
        results["serving"] = serving_suite(engine, examples, clients, log=log)
    if clients and "guidellm" in suites:  # skipped, with the reason, when guidellm is not installed
        from .guidellm_sweep import guidellm_suite

        log("guidellm sweep through /v1/chat/completions")
        results["guidellm"] = guidellm_suite(engine, clients, requests=max(1, requests // 8), log=log)
    return results


def _fairness_and_routing(engine: Engine, examples, nq_path: Path, tmp: Path, suites: tuple[str, ...], log) -> dict:
    """``fairness``: admission policies, two tenants, in this process (:mod:`bench.fairness`); ``routing``:
    replicas and router as processes (:mod:`bench.routing`; needs Redis on loopback)."""
    out = {}
    if "fairness" in suites:
        from .fairness import fairness_suite

        out["fairness"] = fairness_suite(engine, examples, log=log)
    if "routing" in suites:
        from .routing import routing_suite

        out["routing"] = routing_suite(nq_path, engine.settings.models_dir, tmp / "routing", log=log)
    return out


def _ttft_rows(engine: Engine, st, examples, question: str, lengths: list[int], repeats: int, log) -> list[dict]:
    """Per context length (tokens, 10 documents): full prefill, linked from the host tier, from LMDB with a
    warm and a cold page cache, the physical floor and the first decode step, side by side."""
    rows, start = [], 100
    for total in lengths:
        docs = documents_for_budget(engine, examples, 10, total, start=start)
        start += 80
        for d in docs:
            engine.get_or_encode(d)
        keys = [engine.cache_key(d) for d in docs]
        log(f"TTFT at ~{total} tokens")
        full = ttft_full(engine, question, docs, repeats)
        host = ttft_linked(engine, question, docs, repeats)
        # before each repeat: the last repeat's memory-tier fill done (it belongs to that query, not this one),
        # then the documents out of the memory tiers
        warm = ttft_linked(engine, question, docs, repeats,
                           before=lambda: (TIER_FILLER.join(), [st.tiered.invalidate(k) for k in keys]))
        cold_ok = drop_page_cache()
        cold = ttft_linked(engine, question, docs, repeats,
                           before=lambda: (TIER_FILLER.join(), [st.tiered.invalidate(k) for k in keys],
                                           drop_page_cache())) if cold_ok else None
        floor = physical_floor(engine, question, docs, repeats)
        step = first_decode_step(engine, question, docs, repeats)
        ctx_tokens = int(engine.prompt_ids(question, docs).numel())
        rows.append({"target_tokens": total, "context_tokens": ctx_tokens, "full": full.as_dict(),
                     "linked_host": host, "linked_lmdb_warm": warm, "linked_lmdb_cold": cold,
                     "floor": floor, "first_decode_step": step.as_dict(),
                     "speedup_host": full.median / host["total"]["median_s"],
                     "speedup_lmdb_warm": full.median / warm["total"]["median_s"],
                     "linked_over_floor": host["total"]["median_s"] / floor["floor_s"]})
    return rows


def _bandwidth(engine: Engine, st, docs: list, repeats: int) -> dict:
    """LMDB -> tensors load bandwidth (whole documents, and streamed into a request's KV blocks) and bytes per
    token, in the KV dtype and in int8."""
    bw = {}
    for int8 in (False, True):
        items = {}
        for i, d in enumerate(docs):
            kv = engine.encode(d)
            key = f"bench-bw-{int8}-{i}"
            st.blobs.put(key, kv, int8=int8)
            items[key] = kv
        bw["int8" if int8 else engine.settings.kv_dtype] = {
            **load_bandwidth(st.blobs, items, repeats=max(3, repeats)),
            "blocks": stream_into_blocks(st.blobs, list(items), repeats=max(3, repeats)),
            "bytes_per_token": bytes_per_token(st.blobs, list(items))}
    return bw

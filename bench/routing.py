"""``kvlink-rag bench --suites routing``: the router's policies side by side on replicas as processes.

``replicas`` replicas (uvicorn processes, each its own home with ``models/`` linked to this home's, a host tier
of ``host_fraction`` of the corpus' KV bytes) share one Redis DB (index, texts, the shared cache tier, the
fleet's events); ``n_docs`` distinct NQ gold passages are precomputed once (on a replica of their own, so every
policy's replicas start with empty homes and fetch from the shared tier); then per policy the replicas start
afresh (empty host tiers and local LMDBs), a ``kvlink-rag router`` with that policy starts in front of them,
and ``clients`` threads send the same queries (``docs_per_query`` passages drawn Zipf(1.0)) as streamed
``/v1/query`` requests. Reported per policy: host-tier hit rate (the replicas'
``kvlink_cache_hits/misses{tier="host"}``), TTFT p50/p99 (to the stream's headers, sent with the first token),
throughput and max/min requests per replica. The ``kill`` part runs one policy again and SIGKILLs the last
replica halfway through its queries: the failed requests, those in flight on it vs any other
(:func:`bench.routing_clients.kill_outcome`). :data:`ISSUE_SETUP` is issue 27's setup (4 replicas, 1,000
documents, 10 a query, 16 clients); the defaults are a small run (2 replicas, 40, 3, 4).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.routing_clients import kill_outcome, run_clients, summarize
from bench.routing_fleet import Fleet, empty_db, host_counts, replica_names, wait_for
from bench.routing_workload import passage_tokens, zipf_queries
from evaluation.nq import load_nq

POLICIES = ("round-robin", "document-aware")
VARIANTS = {"document-aware w1": ("document-aware", {"KVLINK_RAG_ROUTER_UNCACHED_WEIGHT": "1",
                                                     "KVLINK_RAG_ROUTER_BALANCE_SLACK": "1000"})}
"""Rows beside the policies' when asked for (``policies=``): name -> (policy, router settings): the
document-aware cost before its tuning (uncached tokens weighed 1, no bounded load)."""

ISSUE_SETUP = {"replicas": 4, "n_docs": 1000, "docs_per_query": 10, "clients": 16}
"""Issue 27's setup (:func:`routing_suite`'s arguments): 4 replicas, 1,000 NQ documents, queries of 10, 16 clients."""

KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 2
"""The default model's (SmolLM2-135M) bf16 KV bytes a token: layers x (K, V) x KV heads x head dim x 2 bytes;
used when its ``config.json`` is not at hand."""


def corpus(nq_path: Path, n_docs: int) -> tuple[list, list[str]]:
    """``(examples, questions)``: the first ``n_docs`` NQ examples whose gold passages (title and text) are
    distinct (a repeated passage would share its cache with the first), and their questions.

    Raises:
        ValueError: the file holds fewer distinct passages.
    """
    seen, kept = set(), []
    for e in load_nq(nq_path, limit=2 * n_docs + 20):
        if (e.gold.title, e.gold.text) not in seen and len(kept) < n_docs:
            seen.add((e.gold.title, e.gold.text))
            kept.append(e)
    if len(kept) < n_docs:
        raise ValueError(f"{nq_path}: {len(kept)} distinct gold passages, fewer than {n_docs}")
    return kept, [e.question for e in kept]


def host_tier_bytes(examples, models: Path, fraction: float) -> tuple[int, int]:
    """``(bytes of a host tier holding fraction of the corpus' KV, the corpus' tokens)``: the passages' tokens by
    the default model's tokenizer (words x 1.59 without it) x its KV bytes a token (bf16, from its config)."""
    from kvlink_rag.model.convert import MODEL_DIRNAME

    folder = models / MODEL_DIRNAME
    tokens, _ = passage_tokens(examples, folder / "tokenizer.json")
    per_token = KV_BYTES_PER_TOKEN
    if (folder / "config.json").exists():
        c = json.loads((folder / "config.json").read_text())
        head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        per_token = c["num_hidden_layers"] * 2 * c.get("num_key_value_heads", c["num_attention_heads"]) * head_dim * 2
    return int(fraction * sum(tokens) * per_token), sum(tokens)


def _ready(base: str, n_docs: int) -> int:
    """How many of the replica's documents are ready (its document list, 1,000 a page)."""
    ready, offset = 0, 0
    while offset < n_docs:
        page = httpx.get(f"{base}/v1/documents", params={"offset": offset, "limit": 1000}, timeout=30).json()
        ready += sum(d["status"] == "ready" for d in page["documents"])
        offset += 1000
    return ready


def _precompute(fleet: Fleet, examples, log) -> float:
    """Ingest the passages (``d0``, ``d1``, ...) on a replica of their own (home ``seed``) and wait until all are
    ready (up to max(1200, 3 a document) seconds); the seconds it took. The caches end in the shared tier."""
    seed = fleet.replica("seed", fresh=True)
    docs = [{"id": f"d{i}", "text": e.gold.text, "title": e.gold.title or ""} for i, e in enumerate(examples)]
    t0 = time.perf_counter()
    for i in range(0, len(docs), 256):
        httpx.post(seed + "/v1/documents", json={"documents": docs[i:i + 256]}, timeout=300).raise_for_status()
    last = [0.0]

    def done() -> bool:
        n = _ready(seed, len(docs))
        if time.perf_counter() - last[0] > 60:
            last[0] = time.perf_counter()
            log(f"routing: {n} of {len(docs)} passages ready after {time.perf_counter() - t0:.0f} s")
        return n == len(docs)

    wait_for(done, max(1200, 3 * len(docs)), "precompute", every=2.0)
    seconds = time.perf_counter() - t0
    fleet.stop()
    return seconds


def _overhead(router: str, replica: str, requests: int, question: str, client: httpx.Client | None = None) -> dict:
    """The router's own latency: the same requests to ``replica`` directly and through ``router`` (in front of
    it alone), interleaved (which goes first alternates); per kind ``{direct_p50_s, routed_p50_s,
    overhead_p50_s}`` (the last: median of the per-pair differences)."""
    kinds = {"healthz": ("GET", "/healthz", None),
             "query": ("POST", "/v1/query", {"question": question, "document_ids": ["d0"]})}
    out = {}
    with client or httpx.Client(timeout=120) as c:
        for kind, (method, path, body) in kinds.items():
            times: dict[str, list[float]] = {"direct": [], "routed": []}
            for i in range(requests + 2):  # two warm-ups each, not counted
                for name in (("direct", "routed") if i % 2 == 0 else ("routed", "direct")):
                    t0 = time.perf_counter()
                    c.request(method, (replica if name == "direct" else router) + path, json=body).raise_for_status()
                    if i >= 2:
                        times[name].append(time.perf_counter() - t0)
            diffs = sorted(r - d for r, d in zip(times["routed"], times["direct"]))
            out[kind] = {"direct_p50_s": sorted(times["direct"])[requests // 2],
                         "routed_p50_s": sorted(times["routed"])[requests // 2], "overhead_p50_s": diffs[requests // 2],
                         "requests": requests}
    return out


def _hit_rate(hits: float, misses: float) -> float:
    return hits / max(1.0, hits + misses)


def _retries(router_log: Path) -> int:
    """Requests the router sent elsewhere after a replica failed before its first byte (its log's warnings)."""
    text = router_log.read_text(errors="replace") if router_log.exists() else ""
    return text.count("; retrying")


def _policy_row(fleet: Fleet, policy: str, n_replicas: int, queries: list[list[int]], questions: list[str],
                clients: int, kill: bool = False) -> dict:
    """One policy over fresh replicas: :func:`bench.routing_clients.summarize`'s row and the host-tier hit
    rate (``host_hits``, ``host_misses``: document lookups summed over the replicas), over the whole run and
    over its second half (``..._second_half``: from when half the queries were taken, its warm part). With
    ``kill``, the last replica is SIGKILLed then (just after the half's counters are read; it counts up to
    there), and ``kill`` reports :func:`bench.routing_clients.kill_outcome`."""
    reps = dict(zip(replica_names(n_replicas), fleet.replicas(n_replicas)))
    name, settings = VARIANTS.get(policy, (policy, {}))
    router = fleet.router(name, replicas=n_replicas, settings=settings)
    victim = list(reps)[-1]
    before = {n: host_counts(r) for n, r in reps.items()}
    retried = _retries(fleet.folder / f"router-{name}.log")
    mid: dict[str, tuple[float, float]] = {}
    killed_at = [0.0]

    def midway() -> None:
        mid.update({n: host_counts(r) for n, r in reps.items()})
        if kill:
            killed_at[0] = time.perf_counter()
            fleet.kill(victim)

    sent, wall, called_at = run_clients(router, queries, questions, clients, call_at=len(queries) // 2, call=midway)
    after = {n: host_counts(r) for n, r in reps.items() if not (kill and n == victim)}
    after.update({n: mid[n] for n in reps if n not in after})
    row = summarize(sent, wall)
    row["host_hits"] = sum(after[n][0] - before[n][0] for n in reps)
    row["host_misses"] = sum(after[n][1] - before[n][1] for n in reps)
    row["host_hit_rate"] = _hit_rate(row["host_hits"], row["host_misses"])
    live = [n for n in reps if not (kill and n == victim)]
    row["host_hit_rate_second_half"] = _hit_rate(sum(after[n][0] - mid[n][0] for n in live),
                                                 sum(after[n][1] - mid[n][1] for n in live))
    if kill:
        row["kill"] = {**kill_outcome(sent, victim, killed_at[0]), "killed_after_queries": len(queries) // 2,
                       "router_retries": _retries(fleet.folder / f"router-{name}.log") - retried,
                       "killed_at_s": killed_at[0] - min(s.start for s in sent),
                       "kill_s_after_half_taken": killed_at[0] - called_at}
    fleet.stop()
    return row


def routing_suite(nq_path: Path, models: Path, folder: Path, redis_base: str = "redis://127.0.0.1:6379",
                  n_docs: int = 40, n_queries: int = 48, docs_per_query: int = 3, clients: int = 4,
                  host_fraction: float = 0.1, log=print, parts: tuple[str, ...] = ("overhead", "policies"),
                  overhead_requests: int = 40, policies: tuple[str, ...] = POLICIES, replicas: int = 2,
                  kill_policy: str = "document-aware", save=None) -> dict:
    """The policies side by side (see the module docstring); returns ``{setup, overhead, policies: {policy: row},
    kill}`` (``parts``: which of the router's ``overhead`` (:func:`_overhead`), the ``policies`` and the ``kill``
    run (``kill_policy`` with the last replica killed halfway) to measure; ``policies``: router policies or
    :data:`VARIANTS`; ``save``: called with the results so far after each part)."""
    examples, questions = corpus(nq_path, n_docs)
    url = empty_db(redis_base)
    host_bytes, corpus_tokens = host_tier_bytes(examples, models, host_fraction)
    fleet = Fleet(folder, url, models, host_bytes)
    queries = zipf_queries(n_docs, n_queries, docs_per_query)
    out = {"setup": {"replicas": replicas, "documents": n_docs, "corpus_tokens": corpus_tokens, "queries": n_queries,
                     "docs_per_query": docs_per_query, "clients": clients, "host_fraction": host_fraction,
                     "host_tier_bytes": host_bytes, "zipf": 1.0, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                     "note": "replicas at 1 torch thread each on a shared CPU; compare policies within this run only"},
           "policies": {}}
    save = save or (lambda _: None)
    try:
        log(f"routing: precomputing {n_docs} NQ passages")
        out["setup"]["precompute_s"] = _precompute(fleet, examples, log)
        save(out)
        if "overhead" in parts:
            log("routing: the router's own overhead, one replica")
            a = fleet.replica("a", fresh=True)
            out["overhead"] = _overhead(fleet.router("round-robin", replicas=1), a, overhead_requests, questions[0])
            fleet.stop()
            save(out)
        for policy in policies if "policies" in parts else ():
            log(f"routing: policy {policy}, {replicas} replicas, {n_queries} queries")
            out["policies"][policy] = _policy_row(fleet, policy, replicas, queries, questions, clients)
            save(out)
        if "kill" in parts:
            log(f"routing: policy {kill_policy}, replica {replica_names(replicas)[-1]} killed halfway")
            out["kill"] = {"policy": kill_policy,
                           **_policy_row(fleet, kill_policy, replicas, queries, questions, clients, kill=True)}
            save(out)
    finally:
        fleet.stop()
        import redis

        redis.Redis.from_url(url).flushdb()
    return out


@contextmanager
def _tmp():
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kvlink-routing-") as d:
        yield Path(d)


def _arguments(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.routing", description="The router's policies side by side "
                                "on replica processes (needs Redis on loopback and the default model).")
    p.add_argument("nq", type=Path, help="NQ-open oracle JSONL(.gz)")
    p.add_argument("models", type=Path, nargs="?", default=Path.home() / ".cache" / "kvlink-rag" / "models")
    p.add_argument("parts", nargs="?", default="overhead,policies", help="comma list of overhead, policies, kill")
    p.add_argument("--issue", action="store_true", help="issue 27's setup (4 replicas, 1,000 documents, 10 a "
                   "query, 16 clients); the options below override it")
    for flag, kind in (("replicas", int), ("docs", int), ("queries", int), ("docs-per-query", int),
                       ("clients", int), ("host-fraction", float)):
        p.add_argument(f"--{flag}", type=kind)
    p.add_argument("--policies", default=",".join(POLICIES), help="comma list of router policies or variants")
    p.add_argument("--kill-policy", default="document-aware")
    p.add_argument("--json", type=Path, help="write the results here (after each part too)")
    return p.parse_args(argv)


def main(argv: list[str]) -> dict:
    """``python -m bench.routing``: :func:`routing_suite` with the command line's setup; the results (also
    printed as JSON, and written to ``--json`` after each part)."""
    a = _arguments(argv)
    parts = tuple(a.parts.split(","))
    kw = dict(ISSUE_SETUP) if a.issue else {"n_docs": 4 if parts == ("overhead",) else 40}
    given = {"replicas": a.replicas, "n_docs": a.docs, "n_queries": a.queries, "docs_per_query": a.docs_per_query,
             "clients": a.clients, "host_fraction": a.host_fraction}
    kw.update({k: v for k, v in given.items() if v is not None})
    save = (lambda r: a.json.write_text(json.dumps(r, indent=1))) if a.json else None
    with _tmp() as d:
        res = routing_suite(a.nq, a.models, d, log=lambda m: print(m, file=sys.stderr, flush=True), parts=parts,
                            policies=tuple(a.policies.split(",")), kill_policy=a.kill_policy, save=save, **kw)
    print(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":  # python -m bench.routing NQ_PATH [MODELS_DIR] [PARTS] [--issue] [--replicas N] ...
    main(sys.argv[1:])

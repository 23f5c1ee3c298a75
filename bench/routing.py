"""``kvlink-rag bench --suites routing``: the router's policies side by side on replicas as processes.

Two replicas (uvicorn processes, each its own home with ``models/`` linked to this home's, a host tier of
``host_fraction`` of the corpus' cache bytes) share one Redis DB (index, texts, the shared cache tier, the
fleet's events); NQ passages are precomputed once; then per policy the replicas start afresh (empty host tiers),
a ``kvlink-rag router`` with that policy starts in front of them, and ``clients`` threads send the same
queries (``docs_per_query`` passages drawn Zipf(1.0)) as streamed ``/v1/query`` requests. Reported per
policy: host-tier hit rate (the replicas' ``kvlink_cache_hits/misses{tier="host"}``), TTFT p50/p99 (to the
stream's headers, sent with the first token), throughput and max/min requests per replica.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.routing_workload import zipf_queries
from evaluation.nq import load_nq

POLICIES = ("round-robin", "document-aware")
VARIANTS = {"document-aware w1": ("document-aware", {"KVLINK_RAG_ROUTER_UNCACHED_WEIGHT": "1",
                                                     "KVLINK_RAG_ROUTER_BALANCE_SLACK": "1000"})}
"""Rows beside the policies' when asked for (``policies=``): name -> (policy, router settings): the
document-aware cost before its tuning (uncached tokens weighed 1, no bounded load)."""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(pred, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if pred():
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"timed out waiting for {what}")


def _empty_db(base: str) -> str:
    import redis

    for db in range(1, 15):
        c = redis.Redis.from_url(f"{base}/{db}")
        if c.dbsize() == 0 and c.set("kvlink-bench:claim", os.getpid(), nx=True, ex=3600):
            return f"{base}/{db}"
    raise RuntimeError(f"no empty Redis DB among 1-14 at {base}")


class Fleet:
    """The replica and router processes of one run (logs under ``folder``)."""

    def __init__(self, folder: Path, url: str, models: Path, host_bytes: int):
        self.folder, self.url, self.models, self.host_bytes = folder, url, models, host_bytes
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("KVLINK_RAG_")}
        self.env.update(KVLINK_RAG_INDEX_URL=url, KVLINK_RAG_SHARED_STORE_URL=url, KVLINK_RAG_DEVICE="cpu",
                        KVLINK_RAG_TORCH_THREADS="1", OMP_NUM_THREADS="1", KVLINK_RAG_MAX_NEW_TOKENS="2",
                        KVLINK_RAG_PLAYGROUND="false")
        self.procs: list[subprocess.Popen] = []

    def _start(self, args: list[str], env: dict, log: str) -> subprocess.Popen:
        p = subprocess.Popen(args, env=env, stdout=open(self.folder / log, "ab"), stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def replica(self, name: str) -> str:
        home = self.folder / name
        if not home.exists():
            home.mkdir(parents=True)
            (home / "models").symlink_to(self.models, target_is_directory=True)
        port = _port()
        env = dict(self.env, KVLINK_RAG_HOME=str(home), KVLINK_RAG_EVENTS_URL=self.url, KVLINK_RAG_REPLICA_ID=name,
                   KVLINK_RAG_REPLICA_URL=f"http://127.0.0.1:{port}", KVLINK_RAG_HOST_CACHE_BYTES=str(self.host_bytes))
        self._start([sys.executable, "-m", "uvicorn", "--factory", "api.main:create_app", "--port", str(port),
                     "--log-level", "warning"], env, f"{name}.log")
        base = f"http://127.0.0.1:{port}"
        _wait(lambda: httpx.get(base + "/readyz", timeout=2).status_code == 200, 300, f"replica {name}")
        return base

    def router(self, policy: str, replicas: int = 2, settings: dict | None = None) -> str:
        port = _port()
        env = dict(self.env, KVLINK_RAG_HOME=str(self.folder / "router"), KVLINK_RAG_ROUTER_POLL_S="0.1",
                   **(settings or {}))
        self._start([sys.executable, "-m", "cli", "router", "--events-url", self.url, "--policy", policy,
                     "--port", str(port)], env, f"router-{policy}.log")
        base = f"http://127.0.0.1:{port}"
        _wait(lambda: len([r for r in httpx.get(base + "/router/status", timeout=2).json()["replicas"]
                           if r["synced"]]) == replicas, 60, "the router's fleet")
        return base

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        self.procs.clear()


def _host_counts(base: str) -> tuple[float, float]:
    """``(hits, misses)`` of the replica's host tier (its /metrics)."""
    text = httpx.get(base + "/metrics", timeout=10).text
    found = [re.search(rf'^kvlink_cache_{what}_total{{tier="host"}} (\S+)$', text, re.M) for what in ("hits", "misses")]
    return tuple(float(m.group(1)) if m else 0.0 for m in found)


def _run(router: str, queries: list[list[int]], questions: list[str], clients: int) -> dict:
    ttft, replicas, lock, todo = [], {}, threading.Lock(), list(enumerate(queries))

    def client() -> None:
        with httpx.Client(base_url=router, timeout=300) as c:
            while True:
                with lock:
                    if not todo:
                        return
                    i, q = todo.pop(0)
                t0 = time.perf_counter()
                body = {"question": questions[i % len(questions)], "document_ids": [f"d{d}" for d in q], "stream": True}
                with c.stream("POST", "/v1/query", json=body) as r:
                    first = time.perf_counter() - t0
                    r.read()
                with lock:
                    ttft.append(first)
                    rep = r.headers.get("x-kvlink-replica", "?")
                    replicas[rep] = replicas.get(rep, 0) + 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft.sort()
    loads = sorted(replicas.values())
    return {"ttft_p50_s": ttft[len(ttft) // 2], "ttft_p99_s": ttft[min(len(ttft) - 1, int(len(ttft) * 0.99))],
            "throughput_qps": len(queries) / wall, "requests_per_replica": replicas,
            "max_min_load": loads[-1] / max(1, loads[0]) if len(loads) > 1 else float("inf")}


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


def routing_suite(nq_path: Path, models: Path, folder: Path, redis_base: str = "redis://127.0.0.1:6379",
                  n_docs: int = 40, n_queries: int = 48, docs_per_query: int = 3, clients: int = 4,
                  host_fraction: float = 0.1, log=print, parts: tuple[str, ...] = ("overhead", "policies"),
                  overhead_requests: int = 40, policies: tuple[str, ...] = POLICIES) -> dict:
    """The policies side by side (see the module docstring); returns ``{setup, overhead, policies: {policy: row}}``
    (``parts``: which of the router's ``overhead`` (:func:`_overhead`) and the ``policies`` to measure;
    ``policies``: router policies or :data:`VARIANTS`)."""
    examples = load_nq(nq_path, limit=n_docs)
    url = _empty_db(redis_base)
    per_doc = 30 * 2 * 3 * 64 * 2 * 200  # SmolLM2-135M bf16 KV of a ~200-token passage (layers, K+V, heads, dim)
    fleet = Fleet(folder, url, models, int(host_fraction * n_docs * per_doc))
    queries = zipf_queries(n_docs, n_queries, docs_per_query)
    out = {"setup": {"replicas": 2, "documents": n_docs, "queries": n_queries, "docs_per_query": docs_per_query,
                     "clients": clients, "host_tier_bytes": fleet.host_bytes, "zipf": 1.0,
                     "note": "measured on a busy shared 2-core CPU machine; compare policies within this run only"},
           "policies": {}}
    try:
        a = fleet.replica("a")
        log(f"routing: precomputing {n_docs} NQ passages")
        docs = [{"id": f"d{i}", "text": e.gold.text, "title": e.gold.title or ""} for i, e in enumerate(examples)]
        httpx.post(a + "/v1/documents", json={"documents": docs}, timeout=120).raise_for_status()
        _wait(lambda: all(httpx.get(f"{a}/v1/documents/d{i}", timeout=10).json()["status"] == "ready"
                          for i in range(n_docs)), 1200, "precompute")
        fleet.stop()
        if "overhead" in parts:
            log("routing: the router's own overhead, one replica")
            a = fleet.replica("a")
            out["overhead"] = _overhead(fleet.router("round-robin", replicas=1), a, overhead_requests,
                                        examples[0].question)
            fleet.stop()
        for policy in policies if "policies" in parts else ():
            log(f"routing: policy {policy}")
            shutil.rmtree(folder / "b", ignore_errors=True)  # b's LMDB as empty for every policy (it keeps fetches)
            reps = [fleet.replica("a"), fleet.replica("b")]
            name, settings = VARIANTS.get(policy, (policy, {}))
            router = fleet.router(name, settings=settings)
            before = [_host_counts(r) for r in reps]
            row = _run(router, queries, [e.question for e in examples], clients)
            after = [_host_counts(r) for r in reps]
            hits = sum(x[0] - y[0] for x, y in zip(after, before))
            misses = sum(x[1] - y[1] for x, y in zip(after, before))
            row["host_hit_rate"] = hits / max(1.0, hits + misses)
            out["policies"][policy] = row
            fleet.stop()
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


if __name__ == "__main__":  # python -m bench.routing NQ_PATH [MODELS_DIR] [PARTS, e.g. overhead or overhead,policies]
    nq = Path(sys.argv[1])
    models = Path(sys.argv[2]) if len(sys.argv) > 2 else Path.home() / ".cache" / "kvlink-rag" / "models"
    picked = tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else ("overhead", "policies")
    with _tmp() as d:
        print(json.dumps(routing_suite(nq, models, d, log=lambda m: print(m, file=sys.stderr), parts=picked,
                                       n_docs=4 if picked == ("overhead",) else 40), indent=1))

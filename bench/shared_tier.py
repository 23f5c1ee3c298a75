"""Shared cache tier benchmarks (issue 14), against a private ``redis-server`` on a free loopback port (append-only
file, ``appendfsync everysec``, as in compose):

* load bandwidth and linked TTFT at ~4k context tokens from the shared Redis tier (local tier cold) vs the local
  LMDB tier (warm) vs host memory, side by side;
* precompute throughput with 1, 2, 3 worker processes (one torch thread each) writing to the shared tier.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from kvlink_rag.engine import Engine
from kvlink_rag.settings import DEFAULT_MODEL
from service.settings import Settings
from kvlink_rag.types import Document
from store.factory import open_store
from store.tiers.tier_fill import TIER_FILLER

from .bandwidth import bytes_per_token, load_bandwidth
from .contexts import documents_for_budget
from .timing import measure
from .ttft import ttft_linked


class RedisMissing(RuntimeError):
    """``redis-server`` is not installed; the shared-tier benchmarks are skipped."""


@contextlib.contextmanager
def private_redis(folder: Path) -> Iterator[str]:
    """``redis://127.0.0.1:PORT/0`` of a redis-server started for the benchmark (killed afterwards).

    Raises:
        RedisMissing: no ``redis-server`` on PATH. TimeoutError: it did not answer within 10 s.
    """
    if shutil.which("redis-server") is None:
        raise RedisMissing("redis-server is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                             "yes", "--appendfsync", "everysec", "--dir", str(folder)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            if time.monotonic() > deadline:
                raise TimeoutError("the benchmark's redis-server did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(10)


def shared_ttft(engine: Engine, docs: list[Document], question: str, url: str, home: Path, repeats: int) -> dict:
    """Linked TTFT over ``docs`` from host memory, local LMDB (warm page cache) and the shared tier with the local
    tier cold, side by side in one process; with the load bandwidth of the shared and the local tier."""
    settings = engine.settings.model_copy(update={"home": home, "shared_store_url": url, "store_max_bytes": 8 << 30,
                                                  "host_cache_bytes": 8 << 30})
    st = open_store(settings)
    saved, engine.cache = engine.cache, st.cache
    try:
        for d in docs:
            engine.get_or_encode(d)  # stored in the shared tier, this host's LMDB and memory
        keys = [engine.cache_key(d) for d in docs]

        def drop_memory() -> None:
            TIER_FILLER.join()  # the last repeat's memory-tier fill ends first (it belongs to that query), as run.py
            st.blobs.drain()  # and its local-tier fills from the shared tier
            for k in keys:
                st.tiered.invalidate(k)

        def drop_local() -> None:
            drop_memory()
            for k in keys:
                st.blobs.local.delete(k)

        memory = ttft_linked(engine, question, docs, repeats)
        local = ttft_linked(engine, question, docs, repeats, before=drop_memory)
        shared = ttft_linked(engine, question, docs, repeats, before=drop_local)
        st.blobs.drain()  # the local fills of the last shared read (they run in the background)
        items = {k: st.shared.get(k) for k in keys}
        for k, kv in items.items():  # once, under full-suite load, a key was missing here (cause not found)
            if st.blobs.local.meta(k) is None:
                st.blobs.local.put(k, kv)
        bw = {"shared": load_bandwidth(st.shared, items, repeats), "local": load_bandwidth(st.blobs.local, items, repeats)}
        raw = measure(lambda: [list(st.shared.open_record(k)[2]) for k in keys], repeats)  # bytes only, no decode
        bw["shared"]["raw_fetch_gbps"] = sum(int(st.shared.meta(k)["nbytes"]) for k in keys) / raw.median / 1e9
        ctx = int(engine.prompt_ids(question, docs).numel())
        return {"context_tokens": ctx, "kv_bytes": sum(kv.nbytes for kv in items.values()),
                "bytes_per_token": bytes_per_token(st.shared, keys), "memory": memory, "local_warm": local,
                "shared_cold": shared, "bandwidth": bw,
                "shared_over_local": shared["total"]["median_s"] / local["total"]["median_s"]}
    finally:
        engine.cache = saved
        st.blobs.close()


def _precompute_worker(settings: Settings, texts: list[tuple[str, str]], url: str, home: str, tag: str,
                       barrier, results) -> None:
    """One worker process: load the model, wait for the others, encode ``texts`` and write each to the shared
    tier (with its own local LMDB, as a worker host does); report ``(tokens, start, end, CPU s)`` (monotonic s)."""
    from service.runtime import apply_torch_threads, load_engine

    settings = settings.model_copy(update={"home": Path(home), "shared_store_url": url, "torch_threads": 1})
    apply_torch_threads(settings)
    st = open_store(settings)
    engine = load_engine(settings, st.cache)
    barrier.wait()
    t0, c0, tokens = time.monotonic(), time.process_time(), 0
    for i, (title, text) in enumerate(texts):
        kv = engine.encode(Document(text, title or None))
        st.blobs.put(f"bench-{tag}-{i}", kv)
        tokens += kv.num_tokens
    results.put((tokens, t0, time.monotonic(), time.process_time() - c0))
    st.blobs.close()


def precompute_workers(settings: Settings, docs: list[Document], url: str, home: Path,
                       counts: list[int]) -> list[dict]:
    """Precompute throughput of ``n`` worker processes (for each ``n`` in ``counts``) sharing ``docs`` round-robin,
    timed from the moment all have loaded the model to the last one's end; ``speedup`` against the first count."""
    from kvlink_rag.model.convert import ensure_default_model

    if settings.model == DEFAULT_MODEL:  # the workers' homes are empty: point them at the converted model
        settings = settings.model_copy(update={"model": str(ensure_default_model(settings.models_dir))})
    ctx = mp.get_context("spawn")
    texts = [(d.title or "", d.text) for d in docs]
    rows: list[dict] = []
    for n in counts:
        barrier, results = ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=_precompute_worker, daemon=True,
                             args=(settings, texts[i::n], url, str(home / f"w{n}-{i}"), f"{n}-{i}", barrier, results))
                 for i in range(n)]
        for p in procs:
            p.start()
        got = [results.get(timeout=1800) for _ in procs]
        for p in procs:
            p.join(60)
        tokens = sum(g[0] for g in got)
        wall = max(g[2] for g in got) - min(g[1] for g in got)
        cpu = sum(g[3] for g in got)  # / wall = the cores the workers actually got (others' jobs share them)
        rows.append({"workers": n, "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall, "cpu_s": cpu,
                     "cores_used": cpu / wall})
    for r in rows:
        r["speedup"] = r["tokens_per_s"] / rows[0]["tokens_per_s"]
    return rows


def shared_tier_suite(engine: Engine, examples: list, question: str, folder: Path, repeats: int,
                      context_tokens: int = 4000, precompute_docs: int = 12, workers: list[int] | None = None,
                      log=print) -> dict:
    """Both benchmarks against one private redis-server; ``{"skipped": reason}`` without redis-server."""
    try:
        with private_redis(folder / "redis") as url:
            log(f"shared tier: TTFT at ~{context_tokens} tokens (memory, local LMDB warm, shared Redis)")
            docs = documents_for_budget(engine, examples, 10, context_tokens, start=1400)
            out = {"redis_url": url, "ttft": shared_ttft(engine, docs, question, url, folder / "ttft-host", repeats)}
            log(f"shared tier: precompute with {workers or [1, 2, 3]} worker processes")
            pool = documents_for_budget(engine, examples, precompute_docs, 300 * precompute_docs, start=1700)
            out["precompute"] = precompute_workers(engine.settings, pool, url, folder / "workers", workers or [1, 2, 3])
            return out
    except RedisMissing as e:
        return {"skipped": str(e)}

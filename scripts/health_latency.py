"""``/healthz`` and ``/readyz`` latency while ``--clients`` clients send cached queries (issue 26, item 7's bar:
100 ms at most), with the default model on a real socket (uvicorn in this process).

Documents are ingested and precomputed first; each client then asks over two of them in a loop (memory-tier
hits). A prober sends ``/healthz`` and ``/readyz`` alternately every 50 ms for ``--seconds``; reported: p50,
p99 and max in milliseconds of each, and the queries answered meanwhile.

Usage: ``.venv/bin/python scripts/health_latency.py --clients 16 [--seconds 15]`` (``KVLINK_RAG_TORCH_THREADS=1``
on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

MODEL = Path.home() / ".cache" / "kvlink-rag" / "models" / "SmolLM2-135M-Instruct"


def _client_loop(url: str, stop: threading.Event, answered: list[int], i: int) -> None:
    body = {"question": f"What does record {i} say?", "document_ids": [f"d{i % 6}", f"d{(i + 1) % 6}"],
            "max_new_tokens": 8}
    with httpx.Client(base_url=url, timeout=600) as c:
        while not stop.is_set():
            if c.post("/v1/query", json=body).status_code == 200:
                answered.append(1)


def _summary(ms: list[float]) -> dict:
    ms = sorted(ms)
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 1), "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 1),
            "max_ms": round(ms[-1], 1)}


def run(args) -> dict:
    from api.main import create_app
    from service.settings import Settings
    from service.runtime import load_engine
    from service_support import LiveServer

    settings = Settings(home=Path(tempfile.mkdtemp(prefix="kvlink-health-")), model=str(MODEL), device="cpu",
                        torch_threads=args.threads)
    app = create_app(settings, load_engine(settings, None))
    docs = [{"id": f"d{i}", "text": f"Record {i}: the keeper of lighthouse {i} lit the lamp every night for "
                                    f"{10 + i} years and wrote down every ship that passed."} for i in range(6)]
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=600) as c:
        c.post("/v1/documents", json={"documents": docs}).raise_for_status()
        while any(c.get(f"/v1/documents/{d['id']}").json()["status"] != "ready" for d in docs):
            time.sleep(0.2)
        stop, answered = threading.Event(), []
        clients = [threading.Thread(target=_client_loop, args=(server.url, stop, answered, i), daemon=True)
                   for i in range(args.clients)]
        for t in clients:
            t.start()
        time.sleep(2)  # the clients are all in flight
        times: dict[str, list[float]] = {"/healthz": [], "/readyz": []}
        deadline = time.perf_counter() + args.seconds
        while time.perf_counter() < deadline:
            for path, got in times.items():
                t0 = time.perf_counter()
                c.get(path)
                got.append((time.perf_counter() - t0) * 1000)
                time.sleep(0.05)
        n_answered = len(answered)
        stop.set()
        for t in clients:
            t.join(120)
    return {"clients": args.clients, "seconds": args.seconds, "queries_answered": n_answered,
            **{path: _summary(ms) for path, ms in times.items()}, "loadavg": open("/proc/loadavg").read().split()[:3]}


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # service_support.LiveServer
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--threads", type=int, default=1)
    print(json.dumps(run(p.parse_args())))


if __name__ == "__main__":
    main()

"""How long cancelled queries keep the model busy (issue 26 item 11), with the default model on a real socket.

Documents are ingested and precomputed, memory tiers and the prefix tree are off (every query loads its
documents' caches from LMDB and prefills its own prompt). Then ``--queries`` queries (half streamed, half
plain JSON) are sent at once, each client closing its connection after a random 0.05-0.6 s. Reported: the
drain time, from the last client leaving until the scheduler holds no request and has finished its last step
(``busy`` false, no step for 0.3 s), the scheduler steps run meanwhile, and the latency of one more query sent
as the last client leaves (it waits behind whatever the cancelled ones still do).

Usage: ``.venv/bin/python scripts/cancel_drain.py [--queries 24] [--docs 12] [--per-query 4] [--seed 0]``
(``KVLINK_RAG_TORCH_THREADS=1`` on a shared machine). To measure older code, put its tree first on
``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
from pathlib import Path

import httpx

MODEL = Path.home() / ".cache" / "kvlink-rag" / "models" / "SmolLM2-135M-Instruct"
TOPICS = ["harbour", "lighthouse", "glacier", "orchard", "railway", "volcano", "library", "canal", "desert",
          "monastery", "observatory", "vineyard"]


def _document(i: int) -> dict:
    topic = TOPICS[i % len(TOPICS)]
    text = " ".join(f"The {topic} number {i} was described in record {j}: it had {i + j} keepers, a stone wall, "
                    f"a red door and a long history of visitors who came every summer." for j in range(6))
    return {"id": f"d{i}", "text": text, "title": f"The {topic} {i}"}


def _cancelled_query(url: str, body: dict, after_s: float, left: list[float]) -> None:
    """POST ``body``, close the connection after ``after_s`` seconds (read timeout), note when."""
    try:
        with httpx.Client(timeout=httpx.Timeout(after_s, connect=5.0)) as client:
            if body.get("stream"):
                with client.stream("POST", f"{url}/v1/query", json=body) as r:
                    for _ in r.iter_bytes():
                        pass
            else:
                client.post(f"{url}/v1/query", json=body)
    except httpx.TimeoutException:
        pass
    left.append(time.perf_counter())


def _wait_drained(sched, quiet_s: float = 0.3, limit_s: float = 600) -> float:
    """``time.perf_counter()`` once the scheduler holds nothing and ran no step for ``quiet_s``."""
    steps, since, deadline = sched.steps, time.perf_counter(), time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        time.sleep(0.01)
        if sched.busy() or sched.steps != steps:
            steps, since = sched.steps, time.perf_counter()
        elif time.perf_counter() - since >= quiet_s:
            return since
    raise TimeoutError("the scheduler never drained")


def run(args) -> dict:
    from api.main import create_app
    from service.settings import Settings
    from service.runtime import load_engine
    from service_support import LiveServer

    home = Path(tempfile.mkdtemp(prefix="kvlink-cancel-"))
    settings = Settings(home=home, model=str(MODEL), device="cpu", host_cache_bytes=0, prefix_cache_bytes=0,
                        max_new_tokens=32, torch_threads=args.threads)
    engine = load_engine(settings, None)
    docs = [_document(i) for i in range(args.docs)]
    rng = random.Random(args.seed)
    app = create_app(settings, engine)
    with LiveServer(app) as server:
        state = app.state.service
        with httpx.Client(base_url=server.url, timeout=600) as c:
            c.post("/v1/documents", json={"documents": docs}).raise_for_status()
            while any(c.get(f"/v1/documents/{d['id']}").json()["status"] != "ready" for d in docs):
                time.sleep(0.2)
            c.post("/v1/query", json={"question": "warm up?", "document_ids": ["d0"]}).raise_for_status()
        sched = state.runtime.scheduler
        bodies = [{"question": f"How many keepers did place {q} have?", "stream": q % 2 == 0, "max_new_tokens": 32,
                   "document_ids": [docs[(q + j) % len(docs)]["id"] for j in range(args.per_query)]}
                  for q in range(args.queries)]
        left: list[float] = []
        steps0, t0 = sched.steps, time.perf_counter()
        threads = [threading.Thread(target=_cancelled_query, args=(server.url, b, rng.uniform(0.05, 0.6), left))
                   for b in bodies]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        last_left = max(left)
        follow_t0 = time.perf_counter()
        with httpx.Client(base_url=server.url, timeout=600) as c:
            c.post("/v1/query", json={"question": "Which door?", "document_ids": ["d1"],
                                      "max_new_tokens": 4}).raise_for_status()
        follow_s = time.perf_counter() - follow_t0
        drained = _wait_drained(sched)
    return {"queries": args.queries, "documents_per_query": args.per_query,
            "clients_left_within_s": round(last_left - t0, 2), "drain_s": round(max(0.0, drained - last_left), 2),
            "steps": sched.steps - steps0, "follow_up_query_s": round(follow_s, 2),
            "loadavg": open("/proc/loadavg").read().split()[:3]}


def main() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # service_support.LiveServer
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queries", type=int, default=24)
    p.add_argument("--docs", type=int, default=12)
    p.add_argument("--per-query", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    print(json.dumps(run(p.parse_args())))


if __name__ == "__main__":
    main()

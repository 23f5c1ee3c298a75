"""Service benchmark on real NQ documents with the default model (numbers for the README's Service note).

1. Query latency breakdown (embedded default, in-process API via TestClient): documents of ``--questions``
   NQ questions (``--docs`` each) are ingested and precomputed by the server's thread pool; then each
   question is asked twice over its documents (first: caches read from LMDB; repeat: from the memory
   tier), and once with ``top_k`` retrieval. Medians of the API's timings, with full-prefill TTFT of the
   same prompts for reference.
2. Precompute throughput per worker (``--redis-url``, an empty Redis DB): one real Celery worker (solo
   pool) precomputes ``--worker-docs`` NQ passages; tokens/s from ingest to the last ``ready``, against a
   raw model forward over the same token ids in this process, measured one after the other (no overlap).

Usage: ``.venv/bin/python scripts/bench_service.py --redis-url redis://127.0.0.1:6379/13 [--threads 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
NQ = ROOT.parent / "shared" / "data" / "nq-open-oracle-dev.jsonl.gz"


def wait_all_ready(client, ids: list[str], timeout: float = 1800) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        details = [client.get(f"/v1/documents/{i}").json() for i in ids]
        if all(d.get("status") == "ready" for d in details):
            return details
        if time.monotonic() > deadline:
            raise TimeoutError("documents not ready")
        time.sleep(0.05)


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def bench_queries(args, engine, examples) -> dict:
    from fastapi.testclient import TestClient

    from api.main import create_app
    from evaluation.nq import best_subspan_em, build_documents
    from service.settings import Settings

    home = Path(tempfile.mkdtemp(prefix="kvlink-bench-"))
    app = create_app(Settings(home=home, model=engine.settings.model, device="cpu"), engine)
    sets = [build_documents(examples, i, args.docs, "random")[0] for i in range(args.questions)]
    with TestClient(app) as c:
        payload, ids = [], {}
        for q, docs in enumerate(sets):
            for d in docs:
                doc_id = f"nq-{abs(hash(d.text)) % 10**12}"
                ids.setdefault(q, []).append(doc_id)
                payload.append({"id": doc_id, "title": d.title or "", "text": d.text})
        unique = list({p["id"]: p for p in payload}.values())
        t0 = time.perf_counter()
        c.post("/v1/documents", json={"documents": unique})
        details = wait_all_ready(c, [p["id"] for p in unique])
        elapsed = time.perf_counter() - t0
        tokens = sum(d["num_tokens"] for d in details)
        cold, warm, search, full_ttft, em = [], [], [], [], []
        for q, ex in enumerate(examples[: args.questions]):
            body = {"question": ex.question, "document_ids": ids[q], "max_new_tokens": args.max_new_tokens}
            cold.append(c.post("/v1/query", json=body).json())
            warm.append(c.post("/v1/query", json=body).json())
            search.append(c.post("/v1/query", json={"question": ex.question, "top_k": args.docs,
                                                    "max_new_tokens": args.max_new_tokens}).json())
            full_ttft.append(engine.answer_full(ex.question, sets[q], max_new_tokens=1).ttft_s)
            em.append(best_subspan_em(warm[-1]["answer"], ex.answers))
    stages = ("retrieval_s", "queue_wait_s", "cache_load_s", "link_s", "ttft_s", "total_s")
    return {
        "documents": len(unique), "doc_tokens_median": statistics.median(d["num_tokens"] for d in details),
        "context_tokens_median": median(warm, "context_tokens"),
        "embedded_precompute_tokens_per_s": tokens / elapsed,
        "first_query_lmdb": {s: median([r["timings"] for r in cold], s) for s in stages},
        "repeat_query_memory": {s: median([r["timings"] for r in warm], s) for s in stages},
        "top_k_query": {s: median([r["timings"] for r in search], s) for s in stages},
        "hits_first": sum(d["cache_hit"] for r in cold for d in r["documents"]),
        "hits_repeat": sum(d["cache_hit"] for r in warm for d in r["documents"]),
        "full_prefill_ttft_s": statistics.median(full_ttft), "accuracy_linked": sum(em) / len(em),
    }


def bench_worker(args, engine, examples) -> dict:
    from fastapi.testclient import TestClient

    from api.main import create_app
    from service.settings import Settings
    from kvlink_rag.types import Document

    home = Path(tempfile.mkdtemp(prefix="kvlink-bench-worker-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVLINK_RAG_")}
    env.update(KVLINK_RAG_HOME=str(home), KVLINK_RAG_BROKER_URL=args.redis_url, KVLINK_RAG_INDEX_URL=args.redis_url,
               KVLINK_RAG_MODEL=engine.settings.model, KVLINK_RAG_DEVICE="cpu",
               KVLINK_RAG_TORCH_THREADS=str(args.threads), PYTHONPATH=str(ROOT))
    log = open(home / "worker.log", "wb")
    worker = subprocess.Popen([str(Path(sys.executable).parent / "celery"), "-A", "workers.celery_app", "worker",
                               "-P", "solo", "-l", "WARNING", "--without-gossip", "--without-mingle"],
                              cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    settings = Settings(home=home, model=engine.settings.model, device="cpu", index_url=args.redis_url,
                        broker_url=args.redis_url)
    unique = {ex.gold.text: ex.gold for ex in examples[args.questions:]}  # distinct texts: no shared caches
    passages = list(unique.values())[: args.worker_docs + 1]
    try:
        with TestClient(create_app(settings, engine)) as c:
            c.post("/v1/documents", json={"id": "warm-up", "text": passages[0].text})  # model load happens here
            wait_all_ready(c, ["warm-up"], timeout=600)
            batch = [{"id": f"w{i}", "title": p.title or "", "text": p.text} for i, p in enumerate(passages[1:])]
            t0 = time.perf_counter()
            c.post("/v1/documents", json={"documents": batch})
            details = wait_all_ready(c, [b["id"] for b in batch])
            worker_s = time.perf_counter() - t0
    finally:
        worker.terminate()
        worker.wait(30)
        import redis

        redis.Redis.from_url(args.redis_url).flushdb()
    tokens = sum(d["num_tokens"] for d in details)
    ids = [engine.document_ids(Document(p.text, p.title or None)) for p in passages[1:]]
    assert sum(int(i.numel()) for i in ids) == tokens
    lm = engine.lm
    with torch.inference_mode():
        lm.model(input_ids=ids[0][None])  # warm-up
        t0 = time.perf_counter()
        for i in ids:
            lm.model(input_ids=i[None], use_cache=True, logits_to_keep=1)
        raw_s = time.perf_counter() - t0
    return {"documents": len(batch), "tokens": tokens, "worker_s": worker_s, "worker_tokens_per_s": tokens / worker_s,
            "raw_forward_s": raw_s, "raw_forward_tokens_per_s": tokens / raw_s,
            "worker_vs_raw": (tokens / worker_s) / (tokens / raw_s)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--questions", type=int, default=5)
    p.add_argument("--docs", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--worker-docs", type=int, default=40)
    p.add_argument("--threads", type=int, default=2, help="torch threads of this process and of the worker")
    p.add_argument("--redis-url", default="", help="empty Redis DB for the worker benchmark (skipped without)")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from evaluation.nq import load_nq
    from kvlink_rag.engine import Engine
    from kvlink_rag.model.convert import ensure_default_model
    from service.settings import Settings, get_settings

    model = str(ensure_default_model(get_settings().models_dir))
    engine = Engine(Settings(home=Path(tempfile.mkdtemp()), model=model, device="cpu"))
    examples = load_nq(NQ, limit=400)
    result = {"threads": args.threads, "queries": bench_queries(args, engine, examples)}
    if args.redis_url:
        result["worker"] = bench_worker(args, engine, examples)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()

"""Three hosts as three kinds of processes, each with its own ``KVLINK_RAG_HOME`` and no shared files, sharing
only Redis: ``kvlink-rag ingest`` on host A, a Celery worker on host B precomputes, ``kvlink-rag query`` on host
C (an empty home) answers with every document a cache hit; once with a standalone Redis as the shared tier,
once with a real 3-node Redis Cluster. The model checkpoint is the one shared volume (as in compose)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from service_support import VENV_BIN, celery_worker, save_tiny_checkpoint, wait_for, worker_env
from store.backends import open_index

QUESTION = "Who kept the lighthouse lamp burning?"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny")


def _env(home: Path, url: str, shared: str, model: Path) -> dict[str, str]:
    return worker_env(home, url, model, KVLINK_RAG_SHARED_STORE_URL=shared, KVLINK_RAG_MAX_NEW_TOKENS="3",
                      KVLINK_RAG_STORE_MAX_BYTES=str(64 << 20), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def _cli(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run([str(VENV_BIN / "kvlink-rag"), *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("tier", ["standalone", "cluster"])
def test_ingest_on_a_precompute_on_b_and_a_query_on_c_hits_every_cache(tmp_path, index_server, checkpoint,
                                                                        documents, request, tier):
    shared = (request.getfixturevalue("cluster").url if tier == "cluster"
              else request.getfixturevalue("shared_server").url())
    url = index_server.url(15)
    index_server.client(db=15).flushdb()
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in documents))
    homes = {h: tmp_path / f"host-{h}" for h in "abc"}

    ingested = json.loads(_cli(["ingest", str(corpus), "--json"], _env(homes["a"], url, shared, checkpoint)))
    assert sorted(d["id"] for d in ingested["documents"]) == sorted(d["id"] for d in documents)
    worker = celery_worker(_env(homes["b"], url, shared, checkpoint), tmp_path / "worker-b.log", "b")
    index = open_index(url)
    try:
        def all_ready():
            return all(getattr(index.get("default", d["id"]), "status", "") == "ready" for d in documents)

        try:
            wait_for(all_ready, 180, interval=0.5, what="host B's worker to precompute every document")
        except TimeoutError:
            raise AssertionError(worker.output()[-4000:]) from None
    finally:
        worker.stop()
    assert "precomputed default/lighthouse v1" in worker.output()

    args = ["query", QUESTION, "--json"] + [x for d in documents[:3] for x in ("--doc-id", d["id"])]
    body = json.loads(_cli(args, _env(homes["c"], url, shared, checkpoint)))
    assert [d["cache_hit"] for d in body["documents"]] == [True, True, True]
    assert body["answer"] and all(not (homes[h] / "shared").exists() for h in "abc")
    again = json.loads(_cli(args, _env(homes["c"], url, shared, checkpoint)))  # now from host C's local tier
    assert again["answer"] == body["answer"] and all(d["cache_hit"] for d in again["documents"])

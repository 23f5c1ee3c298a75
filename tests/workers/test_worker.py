"""Redis mode end to end: the API enqueues, real Celery worker processes (solo pool) precompute real NQ
documents with the default model; a worker killed with SIGKILL mid-precompute leaves its task to another.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from factories import NQ_PATH, default_model_path, real_engine
from evaluation.nq import build_documents, load_nq
from service.settings import Settings
from service_support import ROOT, WorkerProcess, celery_worker, claimed_redis_db, wait_for, worker_env

pytestmark = pytest.mark.e2e
VISIBILITY_S = 5  # a dead worker's task is redelivered after this many seconds


class Cluster:
    """The API (real model, Redis index and broker on a claimed DB) and its worker processes."""

    def __init__(self, client: TestClient, env: dict, folder: Path):
        self.client, self.env, self.folder = client, env, folder
        self.store = client.app.state.service.store
        self.workers: list[WorkerProcess] = []

    def worker(self) -> WorkerProcess:
        """The running normal worker, started on first use."""
        live = [w for w in self.workers if w.proc.poll() is None and "paused" not in str(w.log)]
        if live:
            return live[0]
        w = celery_worker(self.env, self.folder / f"worker{len(self.workers)}.log", f"w{len(self.workers)}")
        self.workers.append(w)
        return w

    def wait_ready(self, doc_id: str, timeout: float = 150) -> dict:
        def ready():
            body = self.client.get(f"/v1/documents/{doc_id}").json()
            return body if body.get("status") == "ready" else None

        try:
            return wait_for(ready, timeout, interval=0.25, what=f"{doc_id} precomputed by a worker")
        except TimeoutError:
            logs = "\n".join(w.output()[-3000:] for w in self.workers)
            raise TimeoutError(f"{doc_id} not ready; worker logs:\n{logs}") from None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    folder = tmp_path_factory.mktemp("cluster")
    home, model = folder / "home", default_model_path()
    with claimed_redis_db() as url:
        settings = Settings(home=home, model=str(model), device="cpu", index_url=url, broker_url=url,
                            broker_visibility_timeout_s=VISIBILITY_S, max_new_tokens=8)
        env = worker_env(home, url, model, KVLINK_RAG_BROKER_VISIBILITY_TIMEOUT_S=str(VISIBILITY_S))
        with TestClient(create_app(settings, real_engine(home, max_new_tokens=8))) as client:
            c = Cluster(client, env, folder)
            try:
                yield c
            finally:
                for w in c.workers:
                    w.stop()


@pytest.fixture(scope="module")
def nq_docs():
    examples = load_nq(NQ_PATH, limit=200)
    docs, _ = build_documents(examples, 3, 4, "first")
    return examples[3], [{"id": f"nq-{i}", "title": d.title or "", "text": d.text} for i, d in enumerate(docs)]


def test_a_worker_killed_mid_precompute_leaves_the_task_to_another_worker(cluster, nq_docs):
    marker = cluster.folder / "paused.marker"
    paused = WorkerProcess([sys.executable, str(ROOT / "tests" / "workers" / "paused_worker.py")],
                           {**cluster.env, "KVLINK_TEST_PAUSE_MARKER": str(marker)}, cluster.folder / "paused.log")
    cluster.workers.append(paused)
    doc = nq_docs[1][1]
    assert cluster.client.post("/v1/documents", json=doc).status_code == 202
    wait_for(marker.exists, 150, interval=0.25, what=f"the paused worker to reach the cache write\n{paused.output()}")
    key = marker.read_text()
    paused.kill(signal.SIGKILL)  # mid-precompute: the KV is computed, nothing written, message not acked
    assert paused.proc.returncode == -signal.SIGKILL
    assert cluster.client.get(f"/v1/documents/{doc['id']}").json()["status"] == "queued"
    assert key not in cluster.store.blobs  # no half cache

    other = cluster.worker()
    ready = cluster.wait_ready(doc["id"])
    assert ready["cache_key"] == key and key in cluster.store.blobs and ready["num_tokens"] > 50
    assert f"precomputed default/{doc['id']} v1" in other.output()


def test_workers_precompute_real_documents_and_queries_answer_from_the_cache(cluster, nq_docs):
    example, docs = nq_docs
    cluster.worker()
    assert cluster.client.post("/v1/documents", json={"documents": docs}).status_code == 202
    keys = {d["id"]: cluster.wait_ready(d["id"])["cache_key"] for d in docs}
    assert all(k in cluster.store.blobs for k in keys.values())

    r = cluster.client.post("/v1/query", json={"question": example.question, "document_ids": list(keys)})
    assert r.status_code == 200, r.text
    body = r.json()
    assert all(d["cache_hit"] for d in body["documents"]) and body["answer"].strip()
    assert body["timings"]["ttft_s"] < body["timings"]["total_s"]

    gold = docs[0]
    new_text = gold["text"] + " This passage was revised."
    assert cluster.client.put(f"/v1/documents/{gold['id']}", json={"text": new_text}).json()["version"] == 2
    wait_for(lambda: cluster.client.get(f"/v1/documents/{gold['id']}").json()["version"] == 2 and
             cluster.client.get(f"/v1/documents/{gold['id']}").json()["status"] == "ready", 60, interval=0.25,
             what="the update precomputed")
    new_key = cluster.client.get(f"/v1/documents/{gold['id']}").json()["cache_key"]
    assert new_key != keys[gold["id"]] and new_key in cluster.store.blobs and keys[gold["id"]] not in cluster.store.blobs
    after = cluster.client.post("/v1/query", json={"question": example.question, "document_ids": [gold["id"]]}).json()
    assert after["documents"][0]["version"] == 2 and after["documents"][0]["cache_hit"] is True
    metrics = cluster.client.get("/metrics").text
    assert "kvlink_precompute_queue_depth 0.0" in metrics

"""The router and two replicas as processes on loopback (uvicorn each; every replica its own KVLINK_RAG_HOME, its
models/ a link to the shared converted default model), sharing one private Redis DB (index, texts, the fleet's
registrations and cache events): a query goes to the replica holding its documents, a gap in a replica's event
stream is resynced by a snapshot, a killed replica is dropped within seconds and its queries answered by the
other."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import pytest

from router_support import fleet_of
from service.cache_publisher import registration_key, stream_key
from service_support import ROOT, VENV_BIN, WorkerProcess, free_port, wait_for

MODELS = Path.home() / ".cache" / "kvlink-rag" / "models"
pytestmark = pytest.mark.e2e


def _base_env(url: str, home: Path) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("KVLINK_RAG_")}
    env.update(KVLINK_RAG_HOME=str(home), KVLINK_RAG_INDEX_URL=url, KVLINK_RAG_DEVICE="cpu",
               KVLINK_RAG_TORCH_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return env


def _replica(tmp_path: Path, name: str, url: str) -> tuple[WorkerProcess, str]:
    home = tmp_path / name
    home.mkdir()
    (home / "models").symlink_to(MODELS, target_is_directory=True)
    port = free_port()
    env = _base_env(url, home)
    env.update(KVLINK_RAG_EVENTS_URL=url, KVLINK_RAG_REPLICA_ID=name, KVLINK_RAG_REPLICA_URL=f"http://127.0.0.1:{port}",
               KVLINK_RAG_HEARTBEAT_INTERVAL_S="0.2", KVLINK_RAG_REPLICA_TTL_S="1", KVLINK_RAG_MAX_NEW_TOKENS="2",
               KVLINK_RAG_PLAYGROUND="false", KVLINK_RAG_MAX_RUNNING_REQUESTS="2")
    args = [str(VENV_BIN / "uvicorn"), "--factory", "api.main:create_app", "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "warning"]
    return WorkerProcess(args, env, tmp_path / f"{name}.log"), f"http://127.0.0.1:{port}"


def _up(proc: WorkerProcess, base: str) -> httpx.Client:
    def ready():
        assert proc.proc.poll() is None, proc.output()[-3000:]
        try:
            return httpx.get(base + "/readyz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(ready, 180, interval=0.3, what=f"{base} ready")
    return httpx.Client(base_url=base, timeout=120)


@pytest.mark.skipif(not (MODELS / "SmolLM2-135M-Instruct").exists(), reason="the converted default model is absent")
def test_router_routes_by_documents_resyncs_a_gap_and_drops_a_dead_replica(tmp_path, index_server, documents):
    url = index_server.url(13)
    index_server.client(db=13).flushdb()
    procs = []
    try:
        (pa, ua), (pb, ub) = _replica(tmp_path, "a", url), _replica(tmp_path, "b", url)
        procs += [pa, pb]
        rport = free_port()
        renv = _base_env(url, tmp_path / "router")
        renv.update(KVLINK_RAG_ROUTER_POLL_S="0.1", KVLINK_RAG_ROUTER_DEAD_AFTER_S="1.5",
                    KVLINK_RAG_ROUTER_SHARED_TIER="false")
        pr = WorkerProcess([str(VENV_BIN / "kvlink-rag"), "router", "--events-url", url, "--port", str(rport)],
                           renv, tmp_path / "router.log")
        procs.append(pr)
        ca, cb = _up(pa, ua), _up(pb, ub)
        cr = httpx.Client(base_url=f"http://127.0.0.1:{rport}", timeout=120)
        wait_for(lambda: _status(cr) is not None, 60, interval=0.3, what="router up")

        small = [{**d, "text": d["text"][:200]} for d in documents]
        assert ca.post("/v1/documents", json={"documents": small}).status_code == 202
        for d in small:
            wait_for(lambda d=d: ca.get(f"/v1/documents/{d['id']}").json()["status"] == "ready", 120, interval=0.3)
        assert cb.post("/v1/query", json={"question": "lava?", "document_ids": ["volcano"]}).status_code == 200
        fleet_of(cr, 2)
        wait_for(lambda: {r["id"]: r["documents"] for r in _status(cr)}.get("a", 0) >= 4, 10, what="a's holding")

        r = cr.post("/v1/query", json={"question": "Who kept the lamp?", "document_ids": ["lighthouse", "paris"]})
        assert r.status_code == 200 and r.headers["x-kvlink-replica"] == "a", r.text
        # b's host tier takes volcano after its query, on the low-priority tier-fill thread: wait for that
        # event to reach the router (b's published sequence number) before asking where volcano goes
        wait_for(lambda: _host_entries(cb) >= 1, 60, interval=0.2, what="volcano in b's host tier")
        seq_b = json.loads(index_server.client(db=13).get(registration_key("b")))["seq"]
        wait_for(lambda: next(x["seq"] for x in _status(cr) if x["id"] == "b") >= seq_b, 10, what="router has b's events")
        # and for both replicas' heartbeats to report them idle: a stale "running: 1" (256 tokens of load) outweighs
        # volcano's ~50 uncached tokens on a, and the router rightly sends it there
        wait_for(lambda: all(x["load"]["running"] + x["load"]["waiting"] == 0 for x in _status(cr)), 10,
                 interval=0.1, what="an idle fleet")
        r = cr.post("/v1/query", json={"question": "lava?", "document_ids": ["volcano"]})
        assert r.headers["x-kvlink-replica"] == "b"

        # a gap: an event numbered past b's last one, as if some were lost; the router asks for a snapshot
        # (b's picture is read before the gap is written: read after, the router may already have applied the
        # phantom and asked for the snapshot, and then neither the count nor the holding it waits for would come)
        client = index_server.client(db=13)
        before = {r["id"]: r for r in _status(cr)}["b"]
        reg = json.loads(client.get(registration_key("b")))
        client.xadd(stream_key("b"), {"epoch": reg["epoch"], "seq": str(reg["seq"] + 1000), "op": "stored",
                                      "tier": "host", "key": "phantom", "tokens": "1"})
        wait_for(lambda: (s := {r["id"]: r for r in _status(cr)}["b"])["resyncs"] > before["resyncs"]
                 and s["synced"] and s["documents"] == before["documents"], 30, what="b resynced")  # a bound, not a timing: the
        # snapshot comes from a replica process that a loaded CI machine may keep waiting (10 s ran out once)

        pb.kill(signal.SIGKILL)  # no goodbye: its registration expires
        wait_for(lambda: [r["id"] for r in _status(cr)] == ["a"], 6, interval=0.2, what="b dropped")
        r = cr.post("/v1/query", json={"question": "lava?", "document_ids": ["volcano"]})
        assert r.status_code == 200 and r.headers["x-kvlink-replica"] == "a"
    finally:
        for p in procs:
            p.stop()


def _host_entries(client: httpx.Client) -> float:
    """Documents a replica's host tier holds, from its /metrics (``kvlink_cache_entries{tier="host"}``)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in client.get("/metrics").text.splitlines()
               if line.startswith('kvlink_cache_entries{') and 'tier="host"' in line)


def _status(client: httpx.Client) -> list[dict] | None:
    try:
        return client.get("/router/status").json()["replicas"]
    except (httpx.TransportError, ValueError):
        return None

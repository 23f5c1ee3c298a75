"""The routing bench's processes (:mod:`bench.routing`): N replicas (uvicorn, each its own home with ``models/``
linked to this home's) and a ``kvlink-rag router`` in front of them, sharing one Redis DB; and reading a
replica's host-tier counters."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout: float, what: str, every: float = 0.3) -> None:
    """Call ``pred`` every ``every`` seconds until it is true (a transport error counts as false).

    Raises:
        TimeoutError: not true within ``timeout`` seconds.
    """
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if pred():
                return
        except httpx.TransportError:
            pass
        time.sleep(every)
    raise TimeoutError(f"timed out waiting for {what}")


def empty_db(base: str) -> str:
    """The URL of an empty Redis DB (1-14) at ``base``, claimed for an hour (a key only this process set).

    Raises:
        RuntimeError: none of them is empty.
    """
    import redis

    for db in range(1, 15):
        c = redis.Redis.from_url(f"{base}/{db}")
        if c.dbsize() == 0 and c.set("kvlink-bench:claim", os.getpid(), nx=True, ex=3600):
            return f"{base}/{db}"
    raise RuntimeError(f"no empty Redis DB among 1-14 at {base}")


def replica_names(n: int) -> list[str]:
    """Names (and home folders) of ``n`` replicas: ``a``, ``b``, ... (``r0``, ``r1``, ... past 26)."""
    return [chr(ord("a") + i) for i in range(n)] if n <= 26 else [f"r{i}" for i in range(n)]


class Fleet:
    """The replica and router processes of one run (homes and logs under ``folder``); ``host_bytes``: each
    replica's host tier (bytes), set before the replicas start."""

    def __init__(self, folder: Path, url: str, models: Path, host_bytes: int):
        self.folder, self.url, self.models, self.host_bytes = folder, url, models, host_bytes
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("KVLINK_RAG_")}
        self.env.update(KVLINK_RAG_INDEX_URL=url, KVLINK_RAG_SHARED_STORE_URL=url, KVLINK_RAG_DEVICE="cpu",
                        KVLINK_RAG_TORCH_THREADS="1", OMP_NUM_THREADS="1", KVLINK_RAG_MAX_NEW_TOKENS="2",
                        KVLINK_RAG_PLAYGROUND="false")
        self.procs: list[subprocess.Popen] = []
        self.replica_procs: dict[str, subprocess.Popen] = {}

    def _start(self, args: list[str], env: dict, log: str) -> subprocess.Popen:
        p = subprocess.Popen(args, env=env, stdout=open(self.folder / log, "ab"), stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def replica(self, name: str, fresh: bool = False) -> str:
        """Start replica ``name`` (its home ``folder/name``; ``fresh``: emptied first, so no local LMDB copy
        survives from an earlier run) and wait until it is ready (up to 300 s); its base URL."""
        home = self.folder / name
        if fresh:
            shutil.rmtree(home, ignore_errors=True)
        if not home.exists():
            home.mkdir(parents=True)
            (home / "models").symlink_to(self.models, target_is_directory=True)
        port = _port()
        env = dict(self.env, KVLINK_RAG_HOME=str(home), KVLINK_RAG_EVENTS_URL=self.url, KVLINK_RAG_REPLICA_ID=name,
                   KVLINK_RAG_REPLICA_URL=f"http://127.0.0.1:{port}", KVLINK_RAG_HOST_CACHE_BYTES=str(self.host_bytes))
        self.replica_procs[name] = self._start([sys.executable, "-m", "uvicorn", "--factory", "api.main:create_app",
                                                "--port", str(port), "--log-level", "warning"], env, f"{name}.log")
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: httpx.get(base + "/readyz", timeout=2).status_code == 200, 300, f"replica {name}")
        return base

    def replicas(self, n: int) -> list[str]:
        """Start ``n`` fresh replicas (:func:`replica_names`) one after another; their base URLs."""
        return [self.replica(name, fresh=True) for name in replica_names(n)]

    def kill(self, name: str) -> None:
        """SIGKILL replica ``name`` (no shutdown: its connections reset, its heartbeats stop)."""
        os.killpg(self.replica_procs[name].pid, signal.SIGKILL)

    def router(self, policy: str, replicas: int = 2, settings: dict | None = None) -> str:
        """Start a router with ``policy`` (and ``KVLINK_RAG_ROUTER_*`` ``settings``); wait (up to 60 s) until it
        has synced ``replicas`` replicas; its base URL."""
        port = _port()
        env = dict(self.env, KVLINK_RAG_HOME=str(self.folder / "router"), KVLINK_RAG_ROUTER_POLL_S="0.1",
                   **(settings or {}))
        self._start([sys.executable, "-m", "cli", "router", "--events-url", self.url, "--policy", policy,
                     "--port", str(port)], env, f"router-{policy}.log")
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: len([r for r in httpx.get(base + "/router/status", timeout=2).json()["replicas"]
                              if r["synced"]]) == replicas, 60, "the router's fleet")
        return base

    def stop(self) -> None:
        """SIGTERM every process still running (their process groups), SIGKILL after 30 s."""
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)
        self.procs.clear()
        self.replica_procs.clear()


def host_counts(base: str) -> tuple[float, float]:
    """``(hits, misses)`` of the replica's host tier (its /metrics; documents, or chunks of long ones)."""
    text = httpx.get(base + "/metrics", timeout=10).text
    found = [re.search(rf'^kvlink_cache_{what}_total{{tier="host"}} (\S+)$', text, re.M) for what in ("hits", "misses")]
    return tuple(float(m.group(1)) if m else 0.0 for m in found)

"""Private Redis servers for the shared-tier tests: a standalone ``redis-server`` with the append-only file (and
optionally ``maxmemory``), and a real 3-node Redis Cluster on loopback ports (``redis-server --cluster-enabled
yes`` + ``redis-cli --cluster create``). Each lives in its own folder and is stopped by the test."""

from __future__ import annotations

from collections.abc import Iterator

import contextlib
import os
import random
import signal
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import redis

from service_support import free_port, wait_for


def free_cluster_port() -> int:
    """A free port p whose cluster bus port p + 10000 is free too, both below Linux's ephemeral range (32768+),
    so an outgoing connection cannot take either between this check and the server's bind."""
    for _ in range(200):
        port = random.randrange(12000, 22700)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for a cluster node")


def need_redis_server() -> None:
    """Skip the calling test when redis-server or redis-cli is not installed."""
    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        pytest.skip("redis-server / redis-cli not installed")


class RedisServer:
    """A ``redis-server`` on a free loopback port with ``appendonly yes`` (data in ``folder``).

    Args:
        extra: more ``--option value`` arguments (e.g. ``["--maxmemory", "3mb"]``).
    """

    def __init__(self, folder: Path, extra: list[str] | None = None, port: int | None = None,
                 choose_port=free_port):
        self.folder, self.port, self.extra, self.proc = folder, port or choose_port(), extra or [], None
        self.choose_port = choose_port
        folder.mkdir(parents=True, exist_ok=True)

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self, **kwargs) -> redis.Redis:
        return redis.Redis(port=self.port, socket_connect_timeout=1, **kwargs)

    def start(self, attempts: int = 3) -> RedisServer:
        """Start and wait for PING; a server that exits at once (its port taken since it was chosen) is
        started again on a new port, up to ``attempts`` times."""
        for attempt in range(attempts):
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                 "yes", "--dir", str(self.folder), *self.extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if wait_for(self._up_or_exited, 15, what=f"redis-server on port {self.port}") == "up":
                return self
            self.port = self.choose_port()
        raise RuntimeError(f"redis-server exited at start {attempts} times (ports taken?)")

    def _up_or_exited(self) -> str | None:
        if self.proc.poll() is not None:
            return "exited"
        try:
            return "up" if self.client().ping() else None
        except redis.exceptions.ConnectionError:
            return None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """SIGSTOP for the block (the kernel still accepts connections, nothing answers), SIGCONT after it."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        """SIGKILL: a node that dies, not one that shuts down politely."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


class RedisClusterNodes:
    """Three masters (no replicas) on loopback ports, joined with ``redis-cli --cluster create``."""

    def __init__(self, folder: Path, node_timeout_ms: int = 1000):
        self.nodes = [RedisServer(folder / f"node{i}", ["--cluster-enabled", "yes", "--cluster-config-file",
                                                        "nodes.conf", "--cluster-node-timeout", str(node_timeout_ms),
                                                        "--cluster-require-full-coverage", "no"],
                                  choose_port=free_cluster_port)
                      for i in range(3)]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self) -> RedisClusterNodes:
        for n in self.nodes:
            n.start()
        subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in self.nodes],
                        "--cluster-replicas", "0", "--cluster-yes"], check=True, capture_output=True, timeout=60)

        def ok():
            return all(n.client().cluster("info").get("cluster_state") == "ok" for n in self.nodes)

        wait_for(ok, 30, interval=0.2, what="cluster_state:ok on every node")
        return self

    def node_of(self, key: str) -> RedisServer:
        """The node serving ``key``'s slot (the others answer MOVED)."""
        for n in self.nodes:
            if n.proc is None:
                continue
            with contextlib.suppress(redis.exceptions.ResponseError):
                n.client().exists(key)
                return n
        raise LookupError(f"no live node serves {key}")

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


def private_redis(folder) -> Iterator[RedisServer]:
    """A started private redis-server in ``folder`` (skips without redis-server), stopped at the end: the body
    of the tests' module-scoped server fixtures (``yield from private_redis(tmp_path_factory.mktemp(...))``)."""
    need_redis_server()
    server = RedisServer(folder).start()
    try:
        yield server
    finally:
        server.stop()

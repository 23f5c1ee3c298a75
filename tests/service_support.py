"""Helpers of the service tests: free ports, a private redis-server, a claimed Redis DB on the shared
server, Celery worker processes, a uvicorn server in a thread, a tiny model checkpoint on disk."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
SHARED_REDIS = os.environ.get("KVLINK_RAG_TEST_REDIS", "redis://127.0.0.1:6379")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):
    """Poll ``predicate()`` until truthy (returned) or raise TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


class PrivateRedis:
    """A ``redis-server`` of our own on a free port (never the shared one), data dir ``folder``.

    ``stop()`` saves a snapshot first (``SAVE``) so ``start()`` brings the data back, like a restart of a
    persistent Redis.
    """

    def __init__(self, folder: Path):
        self.folder, self.port, self.proc = folder, free_port(), None
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.folder), "--dbfilename", "dump.rdb"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)

        def up():
            try:
                return client.ping()
            except redis.exceptions.ConnectionError:
                return False

        wait_for(up, 10, what="private redis-server")

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(redis.exceptions.RedisError):
            redis.Redis(port=self.port).save()
        self.proc.terminate()
        self.proc.wait(10)
        self.proc = None


@contextlib.contextmanager
def claimed_redis_db():
    """``redis://.../N`` of an empty DB (1-14) on the shared server, claimed for this test and flushed after."""
    for db in range(1, 15):
        client = redis.Redis.from_url(f"{SHARED_REDIS}/{db}")
        if client.dbsize() == 0 and client.set("kvlink-test:claim", os.getpid(), nx=True, ex=3600):
            try:
                yield f"{SHARED_REDIS}/{db}"
            finally:
                client.flushdb()
            return
    raise RuntimeError("no empty Redis DB among 1-14 on the shared server")


class WorkerProcess:
    """A Celery worker subprocess (log in ``log``), started with ``args`` and ``env``."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path):
        self.log = log
        self._fh = open(log, "ab")
        self.proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=self._fh, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def kill(self, sig=signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)

    def stop(self) -> None:
        """Warm shutdown (TERM), then KILL if it does not end within 15 s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self._fh.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def worker_env(home: Path, broker: str, model: Path, **extra: str) -> dict[str, str]:
    """Environment of a worker: its own home, the broker (also index and backend), model, one torch thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVLINK_RAG_")}
    env.update(KVLINK_RAG_HOME=str(home), KVLINK_RAG_BROKER_URL=broker, KVLINK_RAG_INDEX_URL=broker,
               KVLINK_RAG_MODEL=str(model), KVLINK_RAG_DEVICE="cpu", KVLINK_RAG_TORCH_THREADS="1",
               PYTHONPATH=str(ROOT), **extra)
    return env


def celery_worker(env: dict[str, str], log: Path, name: str) -> WorkerProcess:
    """``celery -A workers.celery_app worker -P solo`` (one task at a time)."""
    args = [str(VENV_BIN / "celery"), "-A", "workers.celery_app", "worker", "-P", "solo", "-l", "INFO",
            "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat"]
    return WorkerProcess(args, env, log)


class LiveServer:
    """A uvicorn server for ``app`` in a thread on a free port (for clients that need a real socket)."""

    def __init__(self, app):
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LiveServer:
        self.thread.start()
        wait_for(lambda: self.server.started, 60, what="uvicorn start")
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def save_tiny_checkpoint(folder: Path, seed: int = 0) -> Path:
    """A tiny random Llama (2 layers, head_dim 16) with the default model's real tokenizer, saved with
    ``save_pretrained`` so ``KVLINK_RAG_MODEL=folder`` loads it like any checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM

    from factories import real_tokenizer, tiny_config

    if (folder / "config.json").exists():
        return folder
    tok = real_tokenizer()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config("llama", head_dim=16, vocab_size=len(tok)),
                                             dtype=torch.float32)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(folder)
    return folder

"""Filling the memory tiers after a layer stream, off the query's path: one low-priority thread per process
reads each streamed document again in position order and hands it to the tiers."""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvlink_rag.omp_pool import serial_thread

if TYPE_CHECKING:
    from kvlink_rag.types import DocumentKV

logger = logging.getLogger(__name__)


TIER_FILL_NICE = 19
"""Nice value of the thread that fills the memory tiers after streams: it runs when the serving threads leave a
core idle (under sustained load CFS still gives it a small share, so the fills complete, late)."""


class _TierFiller:
    """One thread per process that fills the memory tiers with documents streamed from a store: each key read
    again in position order (``get``) and handed to ``on_loaded``, in the order asked, at :data:`TIER_FILL_NICE`.
    One thread and one document at a time bound the memory a burst of streams can hold; a key already waiting
    for the same ``on_loaded`` (equal callables: pass a bound method, not a closure made per stream) is not
    queued twice."""

    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()
        self.waiting: set[tuple[Callable, str]] = set()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.closed = False

    def submit(self, key: str, get: Callable[[str], DocumentKV | None],
               on_loaded: Callable[[str, DocumentKV], None]) -> None:
        """Queue ``on_loaded(key, get(key))`` (skipped when ``get`` finds nothing)."""
        with self.lock:
            if self.closed or (on_loaded, key) in self.waiting:
                return
            self.waiting.add((on_loaded, key))
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="kv-tier-fill", daemon=True)
                self.thread.start()
        self.queue.put((key, get, on_loaded))

    def _run(self) -> None:
        _lower_priority()
        serial_thread()  # its copies never open an OpenMP team beside the serving threads' (kvlink_rag.omp_pool)
        while True:
            item = self.queue.get()
            if item is None:  # closed
                self.queue.task_done()
                return
            key, get, on_loaded = item
            with self.lock:
                self.waiting.discard((on_loaded, key))
            try:
                kv = None if self.closed else get(key)
                if kv is not None:
                    on_loaded(key, kv)
            except Exception:  # noqa: BLE001 - the query had its layers; an unfilled tier is read again next time
                logger.exception("filling the memory tiers with %s failed", key)
            finally:
                self.queue.task_done()

    def join(self) -> None:
        """Wait until every queued fill is done (tests, benchmarks)."""
        self.queue.join()

    def close(self, timeout_s: float = 30.0) -> None:
        """At exit: drop the fills not begun (the memory tiers die with the process) and wait up to ``timeout_s``
        for the one in progress, so no thread is inside torch or LMDB while the interpreter finalises (a daemon
        thread still filling then aborted CLI commands with "terminate called without an active exception")."""
        with self.lock:
            self.closed = True
            thread = self.thread
        if thread is not None and thread.is_alive():
            self.queue.put(None)
            thread.join(timeout_s)


TIER_FILLER = _TierFiller()
"""The process's :class:`_TierFiller` (closed at exit)."""
atexit.register(TIER_FILLER.close)


def _lower_priority() -> None:
    """Lower the calling thread's CPU priority to :data:`TIER_FILL_NICE` (Linux: a thread is a task); ignored
    where refused."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), TIER_FILL_NICE)
    except (OSError, AttributeError):
        pass

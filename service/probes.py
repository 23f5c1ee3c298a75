"""Readiness checks that run in the background, so that asking for readiness never waits for a dependency.

:class:`ProbeMonitor` runs each check (store, shared cache tier, Redis index, broker) in a thread of its own
every ``interval_s`` seconds and keeps the last result; a check still running after ``timeout_s`` seconds is
reported failing ("no answer within ...") until it returns, and is not started again meanwhile (a paused
Redis holds one thread per check, never more). A reader may :meth:`ProbeMonitor.poke` the checks (start those
not running) and wait a few milliseconds for fresh results, then read :meth:`ProbeMonitor.results`: fresh
when the dependencies answer quickly, the cached state when they do not.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.runtime import Runtime

log = logging.getLogger(__name__)

Check = tuple[Callable[[], None], str]
NOT_CHECKED = "not checked yet"


def runtime_checks(rt: Runtime, timeout_s: float) -> dict[str, Check]:
    """``{check: (fn raising when it fails, prefix of the failure)}`` for the store, the shared cache tier
    (when configured), the index (Redis index only) and the queue (broker only) of ``rt``.

    Args:
        timeout_s: socket timeout of the index probe (seconds).
    """
    checks: dict[str, Check] = {"store": (rt.store.blobs.ping, "unreadable")}
    if rt.store.shared is not None:
        checks["shared_store"] = (rt.store.shared.ping, "shared cache tier unreachable")
    if rt.settings.index_url:
        checks["index"] = (lambda: rt.store.index.ping(timeout_s), "Redis unreachable")
    if rt.settings.distributed and rt.queue is not None:
        checks["queue"] = (rt.queue.ping, "Redis broker unreachable")
    return checks


class ProbeMonitor:
    """Runs ``checks`` in the background and keeps their last results.

    Args:
        checks: ``{name: (fn, failure prefix)}``; ``fn()`` raises when the check fails.
        interval_s: seconds between rounds (> 0).
        timeout_s: a check running longer is reported failing (seconds, > 0).
        clock: monotonic seconds.
    Raises:
        ValueError: ``interval_s`` or ``timeout_s`` not positive.
    """

    def __init__(self, checks: dict[str, Check], interval_s: float = 1.0, timeout_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError(f"interval_s and timeout_s must be > 0, got {interval_s}, {timeout_s}")
        self.checks, self.interval_s, self.timeout_s, self.clock = dict(checks), interval_s, timeout_s, clock
        self._pool = ThreadPoolExecutor(max(1, len(self.checks)), thread_name_prefix="readiness")
        self._lock = threading.RLock()  # a future done at once runs its callback inside poke()
        self._inflight: dict[str, tuple[Future, float]] = {}
        self._results = {name: NOT_CHECKED for name in self.checks}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, first_wait_s: float | None = None) -> None:
        """Run a first round, waiting at most ``first_wait_s`` (default ``timeout_s``) seconds for it, then
        start the background rounds."""
        wait(self.poke(), timeout=self.timeout_s if first_wait_s is None else first_wait_s)
        self._thread = threading.Thread(target=self._loop, name="readiness-monitor", daemon=True)
        self._thread.start()

    def poke(self) -> list[Future]:
        """Start every check that is not running; returns the futures of the checks running now."""
        with self._lock:
            if self._stop.is_set():
                return []
            for name, (fn, failure) in self.checks.items():
                if name not in self._inflight:
                    fut = self._pool.submit(_outcome, fn, failure)
                    self._inflight[name] = (fut, self.clock())
                    fut.add_done_callback(partial(self._done, name))
            return [fut for fut, _ in self._inflight.values()]

    def _done(self, name: str, fut: Future) -> None:
        with self._lock:
            if not fut.cancelled():  # cancelled: the monitor was closed before the check started
                self._results[name] = fut.result()
            if self._inflight.get(name, (None,))[0] is fut:
                del self._inflight[name]

    def results(self) -> dict[str, str]:
        """``{check: "ok" | reason}``: the last result of each check, or its failure prefix with "no answer
        within ..." while it has been running longer than ``timeout_s``."""
        now = self.clock()
        with self._lock:
            out = dict(self._results)
            for name, (_, since) in self._inflight.items():
                if now - since > self.timeout_s:
                    out[name] = f"{self.checks[name][1]}: no answer within {self.timeout_s:g} s " \
                                f"(running for {now - since:.1f} s)"
        return out

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poke()

    def close(self) -> None:
        """Stop the rounds (a check still running is left to finish on its own)."""
        with self._lock:  # no round starts after this
            self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _outcome(fn: Callable[[], None], failure: str) -> str:
    """``"ok"`` when ``fn()`` returns, else ``"<failure>: <error>"``."""
    try:
        fn()
        return "ok"
    except Exception as e:  # noqa: BLE001 - any failure is the check's result
        return f"{failure}: {e}"

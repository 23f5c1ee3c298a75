"""Noticing, while the service runs, that the Redis index lost its data, and rebuilding it in the background.

A Redis restarted without its data (no append-only file, a lost volume) or flushed leaves a running host with
an empty index: every list is empty and every document 404, although each host still holds the texts it saw
(mirrored on its disk, :mod:`store.redis_texts`) and their caches. Start-up recovery
(:func:`service.recovery_hooks.recover_at_start`) only runs when the process starts, so :class:`IndexWatch`
checks every ``interval_s`` seconds the index's mark (:meth:`store.index.redis.RedisIndex.mark`: a token
only a data loss removes). When the mark is new or changed, this host copies the texts Redis lacks from its
mirror (never overwriting one Redis holds) and recreates the missing records
(:meth:`service.documents.DocumentService.rebuild_index`: ``ready`` where the cache is stored, else queued
for precompute).
Every host does so for the texts it holds; records already there are kept. A document deleted on another
host, and never read as deleted here, may come back (the lesser loss, as at start).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from service.errors import redis_errors

if TYPE_CHECKING:
    from service.runtime import Runtime
    from store.recovery import RebuildReport

log = logging.getLogger(__name__)


class IndexWatch:
    """Watches the Redis index of ``runtime`` (its engine finds stored caches when it rebuilds).

    Args:
        runtime: the service's runtime; its index must have ``mark()`` (a Redis index).
        interval_s: seconds between checks (> 0).
    Raises:
        ValueError: ``interval_s`` not positive, or the index has no mark (embedded).
    """

    def __init__(self, runtime: Runtime, interval_s: float = 2.0) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        if not hasattr(runtime.store.index, "mark"):
            raise ValueError("only a Redis index can be watched")
        self.runtime, self.interval_s = runtime, interval_s
        self.seen: str | None = None
        self.rebuilds = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Take the current mark (start-up recovery has just run), then check every ``interval_s``."""
        try:
            self.seen = self.runtime.store.index.mark()[0]
        except redis_errors() as e:
            log.warning("index watch: Redis unreachable at start (%s); checking every %g s", e, self.interval_s)
        self._thread = threading.Thread(target=self._loop, name="index-watch", daemon=True)
        self._thread.start()

    def check(self) -> RebuildReport | None:
        """One check: the rebuild's report when the index lost its data (and was rebuilt), else None (also
        while Redis is unreachable)."""
        try:
            token, created = self.runtime.store.index.mark()
            if not created and token == self.seen:
                return None
            log.warning("the Redis index lost its data under this running host (its mark is %s); refilling "
                        "the texts from this host's mirror and rebuilding the index", "new" if created else "another")
            report = self._rebuild()
        except redis_errors() as e:
            log.warning("index watch: Redis unreachable (%s)", e)
            return None
        self.seen, self.rebuilds = token, self.rebuilds + 1
        return report

    def _rebuild(self) -> RebuildReport:
        rt = self.runtime
        seed = getattr(rt.store.texts, "seed_from_local", None)
        copied = seed(always=True) if seed is not None else 0
        report = rt.documents.rebuild_index()
        for tenant in {t for t, _ in report.ready + report.queued}:
            rt.retrieval.invalidate(tenant)
        log.warning("index rebuilt: %d text(s) offered from this host's mirror, %d record(s) ready, %d queued, "
                    "%d kept, %d corrupt texts skipped", copied, len(report.ready), len(report.queued), report.kept,
                    len(report.corrupt_texts))
        return report

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watch must survive; the next check tries again
                log.exception("index watch failed")

    def close(self) -> None:
        """Stop checking (a rebuild under way finishes on its own)."""
        self._stop.set()

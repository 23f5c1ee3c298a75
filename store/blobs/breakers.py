"""Circuit breakers of the shared cache tier: one per target (the Redis server, or each primary of a Redis
Cluster), so that a slow or unreachable target costs a bounded time once, then is skipped.

* **closed** (healthy): calls go through. A call that fails with an outage error (connection refused or reset,
  a socket timeout, a cluster slot without a node) **opens** the target's breaker; the call itself cost at
  most the tier's short socket timeouts (``KVLINK_RAG_SHARED_STORE_TIMEOUT_S``).
* **open**: calls for the target raise :class:`~store.blobs.blob_store.BlobStoreUnavailable` at once, without
  touching the network (the tiered store treats that as a miss: local copy served, or the document
  encoded). A background thread probes each open target every ``probe_interval_s`` seconds (a PING bounded by
  the same timeouts) and **closes** the breaker when it answers.

Counters: ``opened``, ``closed`` (breaker transitions), ``skipped`` (calls refused while open).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from store.blobs.blob_store import BlobStoreUnavailable

log = logging.getLogger(__name__)


class TierSkipped(BlobStoreUnavailable):
    """A call refused because its target's circuit breaker is open (no network call was made)."""


@dataclass
class Opened:
    """An open breaker: since when (``time.monotonic()`` seconds) and the error that opened it."""

    since: float
    reason: str


class TierHealth:
    """Breakers of one shared tier's targets and their background prober.

    Args:
        name: how messages name the tier (its URL without password).
        probe: ``probe(target)`` returns when the target answers, raises otherwise (bounded by the client's
            socket timeouts).
        probe_interval_s: seconds between probes of an open target (> 0).
        whole: the target that stands for the whole tier (its breaker open refuses every call).
        clock: monotonic seconds.
    Raises:
        ValueError: ``probe_interval_s`` not positive.
    """

    def __init__(self, name: str, probe: Callable[[str], None], probe_interval_s: float = 1.0,
                 whole: str = "tier", clock: Callable[[], float] = time.monotonic) -> None:
        if probe_interval_s <= 0:
            raise ValueError(f"probe_interval_s must be > 0, got {probe_interval_s}")
        self.name, self._probe, self.probe_interval_s, self.clock = name, probe, probe_interval_s, clock
        self.whole = whole
        self._open: dict[str, Opened] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._prober: threading.Thread | None = None
        self._closed = False
        self.counters: Counter[str] = Counter()

    # -- the call path -----------------------------------------------------------------------------
    def guard(self, target: str | None) -> None:
        """Refuse a call for ``target`` (None: a call touching every target) while its breaker is open.

        Raises:
            TierSkipped: the breaker is open (no network call was made).
        """
        with self._lock:
            if not self._open:
                return
            which = next(iter(self._open)) if target is None else target if target in self._open else self.whole
            opened = self._open.get(which)
        if opened is not None:
            self.counters["skipped"] += 1
            raise TierSkipped(f"shared cache tier {self.name}: {which} skipped, circuit open for "
                                       f"{self.clock() - opened.since:.1f} s ({opened.reason})")

    def failed(self, target: str, err: BaseException) -> None:
        """Open ``target``'s breaker after an outage error ``err`` and make sure the prober runs."""
        with self._lock:
            if target in self._open or self._closed:
                return
            self._open[target] = Opened(self.clock(), f"{type(err).__name__}: {err}"[:300])
            self.counters["opened"] += 1
            if self._prober is None or not self._prober.is_alive():
                self._prober = threading.Thread(target=self._probe_loop, name="shared-tier-probe", daemon=True)
                self._prober.start()
        log.warning("shared cache tier %s: %s unreachable (%s); skipping it until a probe answers",
                    self.name, target, err)

    # -- state -------------------------------------------------------------------------------------
    def open_targets(self) -> dict[str, Opened]:
        """``{target: Opened}`` of the breakers open now."""
        with self._lock:
            return dict(self._open)

    def is_open(self, target: str) -> bool:
        """Whether ``target``'s breaker is open."""
        with self._lock:
            return target in self._open

    def describe(self, targets: list[str] | None = None) -> str:
        """One line naming the open targets (of ``targets``, if given) and for how long, '' when none."""
        now, opened = self.clock(), self.open_targets()
        rows = [f"{t} (circuit open {now - o.since:.1f} s: {o.reason})" for t, o in opened.items()
                if targets is None or t in targets]
        if not rows:
            return ""
        of = f" of {len(targets)}" if targets is not None and len(targets) > 1 else ""
        return f"{len(rows)}{of} unreachable, probed every {self.probe_interval_s:g} s: " + "; ".join(rows)

    # -- probing -----------------------------------------------------------------------------------
    def probe_now(self, target: str) -> bool:
        """Probe ``target`` once; close its breaker if it answers, open it if not. True when it answered."""
        try:
            self._probe(target)
        except Exception as e:  # noqa: BLE001 - any failure of the probe keeps (or puts) the breaker open
            self.failed(target, e)
            return False
        self._close(target)
        return True

    def _close(self, target: str) -> None:
        with self._lock:
            was = self._open.pop(target, None)
            if was is not None:
                self.counters["closed"] += 1
        if was is not None:
            log.warning("shared cache tier %s: %s answers again after %.1f s; using it", self.name, target,
                        self.clock() - was.since)

    def _probe_loop(self) -> None:
        """Probe every open target each interval; ends when none is open (restarted by :meth:`failed`)."""
        while True:
            self._wake.wait(self.probe_interval_s)
            self._wake.clear()
            with self._lock:
                targets = list(self._open)
                if not targets or self._closed:
                    self._prober = None
                    return
            for target in targets:
                if not self._closed:
                    self.probe_now(target)

    def close(self) -> None:
        """Stop the prober (it ends within one interval; open breakers stay open)."""
        self._closed = True
        self._wake.set()

"""The router's picture of the fleet: live replicas, what each holds and its load, kept current from Redis
(:mod:`service.cache_publisher`: TTL'd registrations with the load heartbeat, one event stream per replica).

Per replica, events are applied in ``seq`` order on top of its last snapshot; a gap (an event whose ``seq`` is
not the last one's plus 1), a new ``epoch`` (a restart) or a new replica asks the replica for a snapshot
(:func:`~service.cache_publisher.snapshot_request_key`) and the holding is replaced when it arrives. A replica
whose registration expired, or whose heartbeat is older than ``dead_after_s``, is dropped.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from router.scoring import ReplicaView
from service.cache_publisher import REGISTRATION_PATTERN, snapshot_request_key, stream_key

log = logging.getLogger(__name__)


@dataclass
class ReplicaState:
    """One replica: where it is, what it holds (key -> tiers), its last heartbeat and the stream position."""

    url: str
    id: str = ""
    epoch: str = ""
    seq: int = 0
    synced: bool = False
    held: dict[str, set[str]] = field(default_factory=dict)
    load: dict = field(default_factory=dict)
    seen: float = 0.0  # monotonic time of the last heartbeat read
    beat: float = 0.0  # the heartbeat's own time field
    stream_id: str = "0-0"
    in_flight: int = 0
    last_done: float = 0.0  # wall-clock time a request the router forwarded here last finished
    down_until: float = 0.0
    resyncs: int = 0

    def apply(self, event: dict) -> bool:
        """Apply one stream entry (str fields); False when a snapshot is needed (a gap, another epoch)."""
        if event.get("epoch") != self.epoch:
            return True  # an older epoch's leftovers (or a newer one: the registration will say)
        seq = int(event.get("seq", 0))
        if event.get("op") == "snapshot":
            held: dict[str, set[str]] = {}
            for tier, key, _tokens in json.loads(event.get("data", "[]")):
                held.setdefault(key, set()).add(tier)
            self.held, self.seq, self.synced = held, seq, True
            return True
        if not self.synced or seq <= self.seq:
            return True  # before the snapshot asked for: it includes this
        gap = seq != self.seq + 1
        self.seq = seq
        tiers = self.held.setdefault(event["key"], set())
        if event.get("op") == "stored":
            tiers.add(event["tier"])
        else:
            tiers.discard(event["tier"])
            if not tiers:
                del self.held[event["key"]]
        return not gap

    def view(self) -> ReplicaView:
        """The :class:`~router.scoring.ReplicaView` of this replica (its holding by reference). A heartbeat
        older than the last request the router saw finish here is stale (it may still count that request):
        then only the router's own in-flight count is its load."""
        lo = self.load if float(self.load.get("time") or 0) > self.last_done else {}
        return ReplicaView(self.url, self.held, int(lo.get("running", 0)), int(lo.get("waiting", 0)),
                           int(lo.get("queued_prefill_tokens", 0)), self.in_flight)


def _text(d: dict) -> dict:
    return {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in d.items()}


class Fleet:
    """Live replicas by URL, refreshed by :meth:`poll` (a background thread from :meth:`start`).

    Args:
        client: redis-py client of the events Redis, or None (only ``static`` replicas, no holdings).
        static: replica URLs (the fleet is these; registrations with other URLs are ignored); empty: every
            registered replica.
        dead_after_s: heartbeat age after which a replica is dropped; down_s: how long a replica that refused
            a connection is skipped; poll_s: seconds between polls.
    """

    def __init__(self, client=None, static: list[str] | None = None, dead_after_s: float = 3.0,
                 down_s: float = 5.0, poll_s: float = 0.2, clock: Callable[[], float] = time.monotonic):
        self.r, self.static = client, [u.rstrip("/") for u in static or []]
        self.dead_after_s, self.down_s, self.poll_s, self.clock = dead_after_s, down_s, poll_s, clock
        self.replicas: dict[str, ReplicaState] = {u: ReplicaState(u, id=u, seen=clock()) for u in self.static}
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-poll", daemon=True)
        self.on_drop: Callable[[str], None] | None = None

    def live(self) -> list[ReplicaState]:
        """Replicas to route to now (not dropped, not marked down)."""
        now = self.clock()
        with self.lock:
            return [r for r in self.replicas.values() if r.down_until <= now]

    def mark_down(self, url: str) -> None:
        """Skip ``url`` for ``down_s`` seconds (it refused a connection or failed before its first byte)."""
        with self.lock:
            if (r := self.replicas.get(url)) is not None:
                r.down_until = self.clock() + self.down_s

    def start(self) -> Fleet:
        if self.r is not None:
            self.poll()
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception as e:  # noqa: BLE001 - Redis down: keep the last picture, static replicas still route
                log.warning("fleet not refreshed: %s", e)

    def poll(self) -> None:
        """Read registrations (adding, updating and dropping replicas), then every replica's new events."""
        self._registrations()
        self._events()

    def _registrations(self) -> None:
        keys = list(self.r.scan_iter(match=REGISTRATION_PATTERN, count=1000))
        bodies = [json.loads(b) for b in self.r.mget(keys) if b is not None] if keys else []
        now = self.clock()
        with self.lock:
            for body in bodies:
                url = str(body.get("url", "")).rstrip("/")
                if self.static and url not in self.replicas:
                    continue
                rep = self.replicas.get(url)
                if rep is None:
                    rep = self.replicas[url] = ReplicaState(url, seen=now)
                if rep.epoch != body.get("epoch") or rep.id != body.get("id"):
                    self._resync(rep, body["id"], body["epoch"])
                if body.get("time") != rep.beat:
                    rep.beat, rep.seen, rep.load = body.get("time"), now, body
            for url, rep in list(self.replicas.items()):
                if now - rep.seen > self.dead_after_s:
                    self._drop(url)

    def _drop(self, url: str) -> None:
        rep = self.replicas[url]
        if url in self.static:  # listed: kept, but nothing known of it any more
            rep.epoch, rep.held, rep.synced, rep.load, rep.seen = "", {}, False, {}, self.clock()
            return
        del self.replicas[url]
        log.warning("replica %s (%s) dropped: no heartbeat for %.1f s", rep.id, url, self.dead_after_s)
        if self.on_drop is not None:
            self.on_drop(url)

    def _resync(self, rep: ReplicaState, replica: str, epoch: str | None = None) -> None:
        """Ask ``replica`` for a snapshot and read its stream from now on (its holding is replaced then)."""
        if epoch is not None and (epoch != rep.epoch or replica != rep.id):
            last = self.r.xrevrange(stream_key(replica), count=1)
            rep.stream_id = last[0][0].decode() if last else "0-0"
            rep.id, rep.epoch, rep.held, rep.seq = replica, epoch, {}, 0
        rep.synced = False
        rep.resyncs += 1
        self.r.set(snapshot_request_key(replica), b"1", ex=60)

    def _events(self) -> None:
        with self.lock:
            streams = {stream_key(r.id): r for r in self.replicas.values() if r.epoch}
            ids = {k: r.stream_id for k, r in streams.items()}
        if not ids:
            return
        for name, entries in self.r.xread(ids, count=10_000) or []:
            rep = streams[name.decode() if isinstance(name, bytes) else name]
            with self.lock:
                for entry_id, fields in entries:
                    rep.stream_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                    if not rep.apply(_text(fields)):
                        log.info("replica %s: gap in cache events at seq %d; resyncing", rep.id, rep.seq)
                        self._resync(rep, rep.id)

"""A replica's cache events and load, published to Redis for ``kvlink-rag router`` (no broker beyond Redis).

* **Events**: every entry stored in or removed from a tier (``device``, ``host``, ``cold``, ``local`` LMDB; see
  :mod:`store.cache_events`) is appended to the Redis Stream :func:`stream_key` as
  ``{epoch, seq, op: stored|removed, tier, key, tokens}``; ``seq`` counts up from 1 per start (``epoch``, a new
  random id each start). Events wait in a bounded queue and a background thread writes them in batches, so a
  query never waits on Redis; when the queue overflows (Redis down) events are dropped, and the reader sees
  the gap in ``seq`` and asks for a snapshot.
* **Snapshot**: ``{epoch, seq, op: snapshot, data: JSON [[tier, key, tokens], ...]}``, the whole holding at
  sequence number ``seq`` (later events apply on top; events are idempotent sets and deletes). Published at
  start and whenever the key :func:`snapshot_request_key` is set (the router does on a gap).
* **Registration / heartbeat**: the key :func:`registration_key` (expires after ``replica_ttl_s``) holds
  ``{id, url, epoch, seq, running, waiting, queued_prefill_tokens, pinned_bytes, time}``, rewritten every
  ``heartbeat_interval_s``; a replica that stops is gone from the fleet once it expires.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

PREFIX = "kvlink:fleet"
STREAM_MAXLEN = 100_000
QUEUE_MAX = 50_000


def stream_key(replica: str) -> str:
    """The Redis Stream of ``replica``'s cache events."""
    return f"{PREFIX}:events:{replica}"


def registration_key(replica: str) -> str:
    """The TTL'd registration (and load heartbeat) of ``replica``."""
    return f"{PREFIX}:replica:{replica}"


def snapshot_request_key(replica: str) -> str:
    """Set by a reader that wants ``replica`` to publish a snapshot."""
    return f"{PREFIX}:snapshot-request:{replica}"


REGISTRATION_PATTERN = f"{PREFIX}:replica:*"


class CachePublisher:
    """The :class:`store.cache_events.CacheEvents` of one replica, written to Redis by a background thread.

    Args:
        client: a redis-py client (bytes responses).
        replica: this replica's id; url: where a router reaches it.
        holdings: ``() -> [(tier, key, tokens)]``, everything held now (the snapshot).
        load: ``() -> {running, waiting, queued_prefill_tokens, ...}`` (the heartbeat's numbers).
        interval_s: heartbeat period; ttl_s: registration lifetime (seconds).
        flush_s: seconds between batched writes of queued events.
    """

    def __init__(self, client, replica: str, url: str, holdings: Callable[[], list[tuple[str, str, int]]],
                 load: Callable[[], dict], interval_s: float = 1.0, ttl_s: float = 3.0, flush_s: float = 0.05):
        self.r, self.replica, self.url = client, replica, url
        self.holdings, self.load = holdings, load
        self.interval_s, self.ttl_s, self.flush_s = interval_s, ttl_s, flush_s
        self.epoch = uuid.uuid4().hex[:12]
        self.seq = 0
        self.dropped = 0
        self._queue: deque[dict] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cache-publisher", daemon=True)
        self._last_beat = 0.0
        self._down = False

    # -- CacheEvents ---------------------------------------------------------------------------------
    def stored(self, tier: str, key: str, tokens: int, nbytes: int) -> None:
        self._push({"op": "stored", "tier": tier, "key": key, "tokens": str(int(tokens))})

    def removed(self, tier: str, key: str) -> None:
        self._push({"op": "removed", "tier": tier, "key": key})

    def _push(self, event: dict) -> None:
        with self._lock:
            self.seq += 1  # a dropped event still takes its number: the reader sees the gap
            if len(self._queue) >= QUEUE_MAX:
                self.dropped += 1
                return
            self._queue.append({"epoch": self.epoch, "seq": str(self.seq), **event})

    def snapshot(self) -> None:
        """Queue a snapshot of every tier's holding (numbered like an event)."""
        data = json.dumps(self.holdings())
        with self._lock:
            self.seq += 1
            self._queue.append({"epoch": self.epoch, "seq": str(self.seq), "op": "snapshot", "data": data})

    # -- the thread ---------------------------------------------------------------------------------
    def start(self) -> CachePublisher:
        """Queue the start snapshot and start the thread."""
        self.snapshot()
        self._thread.start()
        return self

    def close(self) -> None:
        """Write what is queued, drop the registration and stop (best effort when Redis is down)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        try:
            self._flush()
            self.r.delete(registration_key(self.replica))
        except Exception:  # noqa: BLE001 - shutting down: Redis may be gone
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.flush_s):
            try:
                if time.monotonic() - self._last_beat >= self.interval_s:
                    self._heartbeat()
                self._flush()
                if self._down:
                    log.info("cache events: Redis reachable again")
                self._down = False
            except Exception as e:  # noqa: BLE001 - Redis down: events wait (bounded), the router resyncs
                if not self._down:
                    log.warning("cache events not published (%s); retrying", e)
                self._down = True

    def _flush(self) -> None:
        with self._lock:
            batch = list(self._queue)
        if not batch:
            return
        pipe = self.r.pipeline(transaction=False)
        for event in batch:
            pipe.xadd(stream_key(self.replica), event, maxlen=STREAM_MAXLEN, approximate=True)
        pipe.execute()
        with self._lock:
            for _ in batch:
                self._queue.popleft()

    def _heartbeat(self) -> None:
        if self.r.getdel(snapshot_request_key(self.replica)) is not None:
            self.snapshot()
        with self._lock:
            seq = self.seq
        body = {"id": self.replica, "url": self.url, "epoch": self.epoch, "seq": seq, "time": time.time(),
                **self.load()}
        self.r.set(registration_key(self.replica), json.dumps(body), px=int(self.ttl_s * 1000))
        self._last_beat = time.monotonic()


def default_replica_id(port: int) -> str:
    """``<hostname>-<port>``: unique per process on one host."""
    return f"{socket.gethostname()}-{port}"


def start_publisher(settings, runtime) -> CachePublisher | None:
    """The publisher of a served replica (``settings.events_url`` set), attached to the runtime store's memory
    tiers and its local LMDB store and started; None without ``events_url``.

    Args:
        settings: ``events_url``, ``replica_id``, ``replica_url``, ``host``/``port``, heartbeat and TTL.
        runtime: a :class:`service.runtime.Runtime` (its store and scheduler).
    Raises:
        ValueError: ``events_url`` is not a Redis URL.
    """
    if not settings.events_url:
        return None
    from store.blobs.lmdb import LmdbBlobStore
    from store.redis_conn import connect, split_url
    from store.tiers.shared import TieredBlobStore

    store = runtime.store
    blobs = store.blobs.local if isinstance(store.blobs, TieredBlobStore) else store.blobs
    local = blobs if isinstance(blobs, LmdbBlobStore) else None
    tiers = store.tiered.tiers

    def holdings() -> list[tuple[str, str, int]]:
        out = [(t.name, key, tokens) for t in tiers for key, tokens in t.holdings()]
        return out + ([("local", key, 0) for key in local.keys()] if local is not None else [])

    def load() -> dict:
        sched = runtime.scheduler
        s = sched.stats() if sched is not None else {}
        host = next((t for t in tiers if t.name == "host"), None)
        return {"running": s.get("running", 0), "waiting": s.get("waiting", 0),
                "queued_prefill_tokens": s.get("queued_prefill_tokens", 0),
                "host_used_bytes": host.used_bytes if host is not None else 0}

    replica = settings.replica_id or default_replica_id(settings.port)
    host = socket.gethostname() if settings.host in ("0.0.0.0", "::", "") else settings.host  # a wildcard bind
    url = settings.replica_url or f"http://{host}:{settings.port}"
    pub = CachePublisher(connect(split_url(settings.events_url)[0]), replica, url, holdings, load,
                         settings.heartbeat_interval_s, settings.replica_ttl_s)
    for tier in tiers:
        tier.cache_events = pub
    if local is not None:
        local.cache_events = pub
    return pub.start()

"""One in-memory cache tier (device, host or cold): document KV by cache key within a byte budget.

:class:`CacheTier` charges each entry to a tenant, evicts with a pluggable :mod:`eviction policy
<store.tiers.policies>`, holds entries at its :mod:`format <store.tiers.tier_format>` and keeps pinned
entries; :class:`store.tiers.tiered.TieredCache` stacks tiers over the blob store.

Values are shared, never copied on ``get``: treat a returned ``DocumentKV`` as read-only.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch

from kvlink_rag.types import DocumentKV, RetainedKV
from store.cache_events import NO_EVENTS, CacheEvents
from store.tiers.policies import CacheEntry, EvictionPolicy, LRUPolicy
from store.tiers.tier_format import HeldKV, TierFormat, hold


def entry_nbytes(kv: DocumentKV | HeldKV) -> int:
    """Bytes a document occupies in a tier: keys + values + token ids (a held one: :attr:`HeldKV.nbytes`)."""
    if isinstance(kv, HeldKV):
        return kv.nbytes
    return kv.nbytes + kv.token_ids.numel() * kv.token_ids.element_size()


def entry_tokens(kv: DocumentKV | HeldKV) -> int:
    """The document's length in tokens (a held one: the whole document's, not the tokens it keeps)."""
    return kv.num_tokens if isinstance(kv, HeldKV) else int(kv.token_ids.numel())


def _to_device(kv: DocumentKV | HeldKV, device: torch.device) -> DocumentKV | HeldKV:
    if isinstance(kv, HeldKV) or kv.keys.device == device and kv.values.device == device:
        return kv
    # Asynchronous only host -> accelerator (stream-ordered); a device -> host copy must be complete
    # before the CPU tensor is shared.
    nb = device.type != "cpu" and kv.keys.device.type == "cpu"
    return DocumentKV(
        keys=kv.keys.to(device, non_blocking=nb),
        values=kv.values.to(device, non_blocking=nb),
        token_ids=kv.token_ids,
        fingerprint=kv.fingerprint,
        encoding=kv.encoding,
        importance=kv.importance,
    )


class CacheTier:
    """A byte-budgeted map from cache key to document KV on one device.

    Args:
        name: label in stats (``'device'``, ``'host'``).
        byte_budget: bytes the tier may hold.
        policy: eviction strategy (default :class:`LRUPolicy`).
        device: where entries live; ``put`` moves documents there.
        clock: seconds clock for recency and utility (injectable for tests).
        fmt: the retention and dtype entries are held at (:mod:`store.tiers.tier_format`; default lossless: the
            ``DocumentKV`` itself).
        events: told of every entry stored and removed (:mod:`store.cache_events`; set :attr:`cache_events` later to
            publish them), outside the tier's lock.

    Counters (``stats()``): ``hits``, ``misses``, ``evictions``, ``inserts``, ``rejected`` (did not
    fit), ``partial_misses`` (held at a lower retention than asked; also counted in ``misses``), overall and
    per tenant (an eviction counts for the evicted entry's tenant).
    """

    def __init__(
        self,
        name: str,
        byte_budget: int,
        policy: EvictionPolicy | None = None,
        device: str | torch.device = "cpu",
        clock: Callable[[], float] = time.monotonic,
        fmt: TierFormat | None = None,
        events: CacheEvents = NO_EVENTS,
    ) -> None:
        self.name = name
        self.cache_events = events
        self.format = fmt or TierFormat()
        self.byte_budget = int(byte_budget)
        self.policy = policy or LRUPolicy()
        self.device = torch.device(device)
        self.clock = clock
        self.entries: OrderedDict[str, CacheEntry] = OrderedDict()  # least recently used first
        self.usage: dict[str, int] = {}  # tenant -> bytes
        self.used_bytes = 0
        self.counters: Counter[str] = Counter()
        self.tenant_counters: dict[str, Counter[str]] = {}
        self.on_evict: Callable[[CacheEntry], None] | None = None
        self._lock = threading.RLock()

    def _count(self, what: str, tenant: str) -> None:
        self.counters[what] += 1
        self.tenant_counters.setdefault(tenant, Counter())[what] += 1

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: str, tenant: str, retention: float = 1.0, method: str = "importance"
            ) -> DocumentKV | RetainedKV | None:
        """The cached document (the shared object; from a lossy tier, the request's dequantised view,
        :meth:`HeldKV.materialise`) or None; a hit refreshes recency.

        Args:
            retention, method: what the request keeps; an entry holding fewer of the document's tokens is a
                partial miss (None), never served short.
        """
        with self._lock:
            e = self.entries.get(key)
            if e is None or (isinstance(e.kv, HeldKV) and not e.kv.serves(retention, method)):
                self._count("misses", tenant)
                if e is not None:
                    self._count("partial_misses", tenant)
                return None
            e.hits += 1
            e.last_access = self.clock()
            self.entries.move_to_end(key)
            self._count("hits", tenant)
            kv = e.kv
        return kv.materialise(retention, method) if isinstance(kv, HeldKV) else kv

    def put(self, key: str, kv: DocumentKV | HeldKV, tenant: str) -> DocumentKV | HeldKV | None:
        """Insert ``kv`` (moved to this tier's device) charged to ``tenant``, evicting as the policy says.

        A lossy tier holds ``kv`` in its :attr:`format` (:func:`store.tiers.tier_format.hold`), or takes a
        :class:`HeldKV` made for that format (:func:`store.tiers.tier_format.hold_part`) as it is.

        Returns:
            the cached object (on this device; a :class:`HeldKV` in a lossy tier), or None when it cannot fit:
            larger than the budget, or every other entry is pinned. An existing entry is only refreshed.
        Raises:
            ValueError: a :class:`HeldKV` of another retention or dtype than this tier's format.
        """
        if isinstance(kv, HeldKV) and (kv.retention, kv.int8) != (self.format.retention, self.format.int8):
            raise ValueError(f"tier {self.name} holds {self.format.describe()}, not retention {kv.retention}")
        if not self.format.lossless:  # cut and quantise outside the lock, unless the entry is already held
            if (held := self._refresh(key)) is not None:
                return held
            kv = kv if isinstance(kv, HeldKV) else hold(kv, self.format, self.device)
        nbytes = entry_nbytes(kv)
        victims: list[CacheEntry] = []
        with self._lock:
            if (held := self._refresh(key)) is not None:
                return held
            e = None
            pinned_bytes = sum(x.nbytes for x in self.entries.values() if x.pins)
            if nbytes + pinned_bytes > self.byte_budget:
                self._count("rejected", tenant)
                return None
            while self.used_bytes + nbytes > self.byte_budget:
                v = self.policy.choose_victim(self, tenant, nbytes)
                if v is None:
                    self._count("rejected", tenant)
                    break
                self._remove(v)
                self._count("evictions", v.tenant)
                victims.append(v)
            else:
                now = self.clock()
                e = CacheEntry(key, _to_device(kv, self.device), tenant, nbytes, now, now)
                self.entries[key] = e
                self.usage[tenant] = self.usage.get(tenant, 0) + nbytes
                self.used_bytes += nbytes
                self._count("inserts", tenant)
        for v in victims:
            self.cache_events.removed(self.name, v.key)
        if e is not None:
            self.cache_events.stored(self.name, key, entry_tokens(kv), nbytes)
        if self.on_evict is not None:
            for v in victims:
                self.on_evict(v)
        return e.kv if e is not None else None

    def _refresh(self, key: str) -> DocumentKV | HeldKV | None:
        """An existing entry's object, its recency refreshed; None when absent."""
        with self._lock:
            e = self.entries.get(key)
            if e is None:
                return None
            e.last_access = self.clock()
            self.entries.move_to_end(key)
            return e.kv

    def _remove(self, e: CacheEntry) -> None:
        del self.entries[e.key]
        self.used_bytes -= e.nbytes
        left = self.usage[e.tenant] - e.nbytes
        if left:
            self.usage[e.tenant] = left
        else:
            del self.usage[e.tenant]

    def remove(self, key: str) -> bool:
        """Drop an entry (no demotion). False if absent or pinned."""
        with self._lock:
            e = self.entries.get(key)
            if e is None or e.pins:
                return False
            self._remove(e)
        self.cache_events.removed(self.name, key)
        return True

    def pin(self, key: str) -> bool:
        """Protect an entry from eviction (pins nest). False if absent."""
        with self._lock:
            e = self.entries.get(key)
            if e is None:
                return False
            e.pins += 1
            return True

    def unpin(self, key: str) -> None:
        """Undo one :meth:`pin`.

        Raises:
            KeyError: the entry is absent or not pinned.
        """
        with self._lock:
            e = self.entries.get(key)
            if e is None or e.pins <= 0:
                raise KeyError(f"{key} is not pinned in tier {self.name}")
            e.pins -= 1

    @contextmanager
    def pinned(self, keys: Iterable[str]) -> Iterator[list[str]]:
        """Pin the present ``keys`` for the duration of the block; yields the keys pinned."""
        done = [k for k in dict.fromkeys(keys) if self.pin(k)]
        try:
            yield done
        finally:
            for k in done:
                self.unpin(k)

    def holdings(self) -> list[tuple[str, int]]:
        """``[(key, document tokens)]`` of the entries, least recently used first (a snapshot for a router)."""
        with self._lock:
            return [(e.key, entry_tokens(e.kv)) for e in self.entries.values()]

    def keys(self) -> list[str]:
        """Cached keys, least recently used first."""
        with self._lock:
            return list(self.entries)

    def stats(self) -> dict:
        """``{name, device, byte_budget, used_bytes, entries, usage{tenant: bytes}, hits, misses,
        evictions, inserts, rejected, partial_misses, format{retention, dtype}, entries_by_retention{r: n},
        tenants{tenant: {counter: n}}}`` (retentions as ``'%g'`` strings)."""
        with self._lock:
            by_r = Counter(f"{e.kv.retention if isinstance(e.kv, HeldKV) else 1.0:g}" for e in self.entries.values())
            return {
                "format": self.format.describe(),
                "entries_by_retention": dict(by_r),
                "partial_misses": self.counters["partial_misses"],
                "name": self.name,
                "device": str(self.device),
                "byte_budget": self.byte_budget,
                "used_bytes": self.used_bytes,
                "entries": len(self.entries),
                "usage": dict(self.usage),
                **{k: self.counters[k] for k in ("hits", "misses", "evictions", "inserts", "rejected")},
                "tenants": {t: dict(c) for t, c in self.tenant_counters.items()},
            }

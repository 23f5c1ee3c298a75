"""Eviction policies of the in-memory cache tiers, as strategy objects.

A policy only *chooses*; the tier (:class:`store.tiers.tier.CacheTier`, seen here as a :class:`TierView`)
removes. The tier calls
:meth:`EvictionPolicy.choose_victim` repeatedly, under its lock, until the incoming entry fits.
Pinned entries are never offered as victims.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kvlink_rag.types import DocumentKV


@dataclass
class CacheEntry:
    """One cached document in a tier.

    Attributes:
        key: cache key.
        kv: the document, on the tier's device (shared by readers; never modified in place).
        tenant: tenant the bytes are charged to (the one whose request inserted it).
        nbytes: bytes charged (keys + values + token ids).
        inserted, last_access: tier-clock seconds.
        hits: reads since insertion.
        pins: active pins; the entry is not evictable while > 0.
    """

    key: str
    kv: DocumentKV
    tenant: str
    nbytes: int
    inserted: float
    last_access: float
    hits: int = 0
    pins: int = 0


class TierView(Protocol):
    """What a policy reads of a tier (:class:`store.tiers.tier.CacheTier`): entries least to most recently
    used, bytes charged per tenant, the byte budget and the tier's clock (seconds)."""

    entries: Mapping[str, CacheEntry]
    usage: Mapping[str, int]
    byte_budget: int
    clock: Callable[[], float]


def utility(entry: CacheEntry, now: float) -> float:
    """Worth of keeping an entry: ``(1 + hits) / (1 + seconds since last access)``.

    A fresh entry is worth 1; an entry read 9 times is worth 10 right after its last read and 1 about
    9 seconds later.
    """
    return (1.0 + entry.hits) / (1.0 + max(0.0, now - entry.last_access))


class EvictionPolicy(ABC):
    """Chooses which entry of a full tier goes next."""

    @abstractmethod
    def choose_victim(self, tier: TierView, incoming_tenant: str, incoming_nbytes: int) -> CacheEntry | None:
        """The next entry to evict to make room for ``incoming_nbytes`` of ``incoming_tenant``, or None
        when no unpinned entry is left. ``tier.entries`` is ordered least to most recently used."""


class LRUPolicy(EvictionPolicy):
    """Least recently used first."""

    def choose_victim(self, tier: TierView, incoming_tenant: str, incoming_nbytes: int) -> CacheEntry | None:
        return next((e for e in tier.entries.values() if not e.pins), None)


class FairPolicy(EvictionPolicy):
    """Fair-LRU: tenants over their quota lose bytes first; otherwise the lowest utility goes.

    Each tenant present in the tier (plus the incoming one) gets the quota
    ``byte_budget * weight / sum(weights of present tenants)``; weights default to 1 (equal shares),
    so an idle tenant's share is lent to the others until it returns.

    When room is needed:

    1. Tenants whose usage (the incoming entry counted for its tenant) exceeds their quota and that
       hold evictable entries: the one with the largest excess in bytes (ties: tenant name) loses its
       least recently used unpinned entry.
    2. Otherwise the unpinned entry of lowest :func:`utility` goes (ties: least recently used).

    Quotas add up to the budget, so when the tier is full some tenant is over its quota (the incoming
    entry counted); rule 2 therefore only decides when the over-quota tenants have nothing evictable
    (all pinned, or the incoming document alone exceeds its tenant's share). With a single tenant
    the policy is LRU. A flooding tenant evicts its own entries once it reaches its share, and
    another tenant's hot documents survive up to that tenant's share.

    Args:
        weights: tenant -> relative weight (> 0); tenants not listed get ``default_weight``.
    """

    def __init__(self, weights: dict[str, float] | None = None, default_weight: float = 1.0) -> None:
        self.weights = dict(weights or {})
        if any(w <= 0 for w in self.weights.values()) or default_weight <= 0:
            raise ValueError("tenant weights must be > 0")
        self.default_weight = default_weight

    def quotas(self, tier: TierView, incoming_tenant: str | None = None) -> dict[str, float]:
        """Tenant -> quota in bytes, over the tenants present in ``tier`` (and ``incoming_tenant``)."""
        present = set(tier.usage)
        if incoming_tenant is not None:
            present.add(incoming_tenant)
        w = {t: self.weights.get(t, self.default_weight) for t in present}
        total = sum(w.values()) or 1.0
        return {t: tier.byte_budget * wt / total for t, wt in w.items()}

    def choose_victim(self, tier: TierView, incoming_tenant: str, incoming_nbytes: int) -> CacheEntry | None:
        quotas = self.quotas(tier, incoming_tenant)
        evictable: dict[str, CacheEntry] = {}  # tenant -> its least recently used unpinned entry
        for e in tier.entries.values():
            if not e.pins and e.tenant not in evictable:
                evictable[e.tenant] = e
        if not evictable:
            return None
        excess = {}
        for t in evictable:
            used = tier.usage.get(t, 0) + (incoming_nbytes if t == incoming_tenant else 0)
            if used > quotas[t]:
                excess[t] = used - quotas[t]
        if excess:
            worst = min(excess, key=lambda t: (-excess[t], t))
            return evictable[worst]
        now = tier.clock()
        best, best_u = None, None
        for e in tier.entries.values():  # LRU first, so the strict < keeps the older on ties
            if e.pins:
                continue
            u = utility(e, now)
            if best_u is None or u < best_u:
                best, best_u = e, u
        return best

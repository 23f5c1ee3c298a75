"""Pinned documents: their caches stay in this replica's host tier (never evicted), within a byte budget per
tenant (``KVLINK_RAG_PIN_BUDGET_BYTES``). Pinned by ``PUT /v1/documents/{id}`` with ``pinned: true`` or listed in
``KVLINK_RAG_PINNED_DOCUMENTS`` (pinned at start); pins live in memory (a restart re-pins the listed ones).

A pin is one count on the host tier's entry (:meth:`store.tiers.tier.CacheTier.pin`, which request pins nest with);
updating or deleting a pinned document unpins it (its old cache is then evicted as any other).
"""

from __future__ import annotations

import logging
import threading

from service.errors import ServiceError
from store.tiers.tiered import TieredCache

log = logging.getLogger(__name__)


class PinRegistry:
    """The pins of one replica's host tier.

    Args:
        tiered: the memory tiers (a pinned document's cache is loaded into them first).
        budget_bytes: host-tier bytes each tenant may pin.
    Raises:
        ValueError: ``tiered`` has no tier named ``host``.
    """

    def __init__(self, tiered: TieredCache, budget_bytes: int):
        host = [t for t in tiered.tiers if t.name == "host"]
        if not host:
            raise ValueError("pinning needs a host tier")
        self.tiered, self.host, self.budget = tiered, host[0], int(budget_bytes)
        self.pins: dict[tuple[str, str], tuple[list[str], int]] = {}  # (tenant, doc id) -> (keys, bytes)
        self._lock = threading.Lock()

    def tenant_bytes(self, tenant: str) -> int:
        """Host-tier bytes ``tenant`` has pinned."""
        with self._lock:
            return sum(n for (t, _), (_, n) in self.pins.items() if t == tenant)

    def bytes_by_tenant(self) -> dict[str, int]:
        """``{tenant: pinned bytes}`` (for /metrics)."""
        out: dict[str, int] = {}
        with self._lock:
            for (t, _), (_, n) in self.pins.items():
                out[t] = out.get(t, 0) + n
        return out

    def is_pinned(self, tenant: str, doc_id: str) -> bool:
        return (tenant, doc_id) in self.pins

    def pin(self, tenant: str, doc_id: str, keys: list[str]) -> int:
        """Load the document's caches (``keys``) into the host tier and pin them; returns the bytes pinned.
        Pinning a pinned document again changes nothing.

        Raises:
            ServiceError: 409 ``document_not_ready`` (no stored cache yet), ``pin_budget_exceeded`` (the
                tenant's pins would pass the budget: the message has the numbers), ``does_not_fit`` (the host
                tier cannot hold it beside the other pinned entries).
        """
        if (tenant, doc_id) in self.pins:
            return self.pins[(tenant, doc_id)][1]
        if not keys:
            raise ServiceError(409, "document_not_ready", f"document {doc_id!r} has no stored cache yet; pin it "
                               "once its status is ready")
        sizes = self._load(tenant, doc_id, keys)
        need, used = sum(sizes), self.tenant_bytes(tenant)
        if used + need > self.budget:
            raise ServiceError(409, "pin_budget_exceeded", f"pinning {doc_id!r} needs {need} bytes; tenant "
                               f"{tenant!r} pins {used} of its {self.budget}-byte budget, {self.budget - used} "
                               "left (KVLINK_RAG_PIN_BUDGET_BYTES)")
        with self._lock:
            done = [k for k in keys if self.host.pin(k)]
            if len(done) < len(keys):  # evicted between the load and the pin (another request's load)
                for k in done:
                    self.host.unpin(k)
                raise ServiceError(409, "does_not_fit", f"document {doc_id!r} did not stay in the host tier; retry")
            self.pins[(tenant, doc_id)] = (list(keys), need)
        return need

    def _load(self, tenant: str, doc_id: str, keys: list[str]) -> list[int]:
        sizes = []
        for key in keys:
            if self.tiered.get(key, tenant) is None:
                raise ServiceError(409, "document_not_ready", f"the cache of document {doc_id!r} is not stored")
            entry = self.host.entries.get(key)
            if entry is None:
                raise ServiceError(409, "does_not_fit", f"document {doc_id!r} does not fit the host tier beside "
                                   f"its pinned entries ({self.host.byte_budget} bytes, KVLINK_RAG_HOST_CACHE_BYTES)")
            sizes.append(entry.nbytes)
        return sizes

    def unpin(self, tenant: str, doc_id: str) -> bool:
        """Undo :meth:`pin`; False when it was not pinned."""
        with self._lock:
            got = self.pins.pop((tenant, doc_id), None)
            for key in got[0] if got else []:
                try:
                    self.host.unpin(key)
                except KeyError:
                    pass
        return got is not None


def pin_listed(pins: PinRegistry, listed: list[str], index) -> None:
    """Pin ``KVLINK_RAG_PINNED_DOCUMENTS`` (``doc_id`` of tenant default or ``tenant/doc_id``) from the
    index's records; one that cannot be pinned is logged and skipped."""
    for item in listed:
        tenant, _, doc_id = item.rpartition("/")
        tenant = tenant or "default"
        try:
            rec = index.get(tenant, doc_id)
            if rec is None:
                raise ServiceError(404, "document_not_found", f"unknown document {item!r}")
            pins.pin(tenant, doc_id, rec.cache_keys)
        except Exception as e:  # noqa: BLE001 - a listed pin never stops the start
            log.warning("listed pin %s not applied: %s", item, e)


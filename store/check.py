"""``kvlink-rag store check [--repair]``: find (and fix) what the store and the index disagree on.

Problems found by :func:`check_store`, and what ``repair`` does about each:

* caches no record points at (left by a crash, or by an older release) -> deleted;
* ``ready`` records whose cache is gone -> ``queued`` again and their precompute enqueued;
* texts without a record (a lost or corrupt index record) -> the record is recreated from the text
  (:func:`store.recovery.restore_record`);
* records without a text (and not already ``failed``) -> marked ``failed`` ("re-ingest it");
* corrupt texts -> deleted, their record marked ``failed`` ("re-ingest it");
* corrupt records without a readable text -> replaced by a ``failed`` record ("re-ingest it");
* records or texts holding text no encoder accepts (lone surrogates, NaN in metadata; stored before the
  API refused them) -> title and metadata rewritten sanitised (:func:`kvlink_rag.encodable.sanitised`); a
  document text that is not valid Unicode (no tokenizer reads it) is deleted, its record ``failed``.

Caches younger than ``min_age_s`` are never reported unreferenced: a precompute may be about to point a
record at them. Ad-hoc caches (``kvlink-rag ask``/``demo``, written untracked) have no record by design:
they are listed as ``untracked_caches`` for information, not counted as problems and never repaired.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from kvlink_rag.encodable import find_unencodable, sanitised
from store.index.document_index import DocumentRecord, is_corrupt
from store.integrity import CorruptEntry
from store.recovery import restore_record

if TYPE_CHECKING:
    from store.catalog import CacheKeying

TEXT_MISSING = "stored text is missing; re-ingest the document"


@dataclass
class CheckReport:
    """Findings of :func:`check_store` (before any repair); ``(tenant, doc_id)`` pairs unless noted.

    Attributes:
        unreferenced_caches: ``(cache key, payload bytes)`` of caches no record points at.
        missing_caches: ``(tenant, doc_id, cache key)`` of ready records whose cache is not stored.
        texts_without_records, records_without_texts, corrupt_texts, corrupt_records: as named.
        unencodable: documents whose record or text holds text no encoder accepts (lone surrogates, NaN).
        untracked_caches: ``(cache key, payload bytes)`` of ad-hoc caches (information, not a problem).
        repaired: ``repair`` was asked for and done.
    """

    unreferenced_caches: list[tuple[str, int]] = field(default_factory=list)
    missing_caches: list[tuple[str, str, str]] = field(default_factory=list)
    texts_without_records: list[tuple[str, str]] = field(default_factory=list)
    records_without_texts: list[tuple[str, str]] = field(default_factory=list)
    corrupt_texts: list[tuple[str, str]] = field(default_factory=list)
    corrupt_records: list[tuple[str, str]] = field(default_factory=list)
    unencodable: list[tuple[str, str]] = field(default_factory=list)
    untracked_caches: list[tuple[str, int]] = field(default_factory=list)
    repaired: bool = False

    @property
    def problems(self) -> int:
        """Number of problems found."""
        return sum(len(v) for k, v in asdict(self).items() if isinstance(v, list) and k != "untracked_caches")

    @property
    def unreferenced_bytes(self) -> int:
        return sum(n for _, n in self.unreferenced_caches)

    def to_dict(self) -> dict:
        """JSON-able: every list, ``problems``, ``unreferenced_bytes`` and ``repaired``."""
        d = {k: [list(x) for x in v] if isinstance(v, list) else v for k, v in asdict(self).items()}
        return {**d, "problems": self.problems, "unreferenced_bytes": self.unreferenced_bytes}


def _scan(store) -> tuple[dict, dict]:
    """``{(tenant, doc_id): record}`` and ``{(tenant, doc_id): text entry or CorruptEntry}``."""
    records = {(t, r.doc_id): r for t in store.index.tenants() for r in store.index.records(t)}
    texts = {(t, d): v for t, d, v in store.texts.items()}
    return records, texts


def _unreferenced(store, records: dict, min_age_s: float, now: float,
                  untracked: list | None = None) -> list[tuple[str, int]]:
    """``(key, bytes)`` of tracked caches no record points at; ad-hoc ones are appended to ``untracked``."""
    used = {key for r in records.values() for key in r.cache_keys}
    out = []
    for key, row in sorted(store.blobs.entries().items()):
        if key in used or now - row["created"] < min_age_s or store.index.find_by_cache_key(key):
            continue
        meta = store.blobs.meta(key)
        if meta is not None and meta.get("tracked", True) is False:
            if untracked is not None:
                untracked.append((key, int(row["nbytes"])))
            continue
        out.append((key, int(row["nbytes"])))
    return out


def check_store(store, repair: bool = False, engine: CacheKeying | None = None, min_age_s: float = 60.0,
                clock=time.time) -> CheckReport:
    """Compare caches, records and texts of every tenant; with ``repair``, fix what was found (see the
    module docstring).

    Args:
        store: ``store.factory.Store``.
        repair: fix the problems.
        engine: lets a recreated record find its stored cache (``ready`` at once); without one it is
            queued, and its cache (unreferenced until then) is deleted and encoded again.
        min_age_s: caches written less than this many seconds ago are left alone.
        clock: unix seconds.
    Raises:
        redis.exceptions.ConnectionError: the Redis index is unreachable.
    """
    records, texts = _scan(store)
    report = CheckReport()
    for (t, d), rec in sorted(records.items()):
        text = texts.get((t, d))
        if is_corrupt(rec):
            report.corrupt_records.append((t, d))
        elif text is None and rec.status != "failed":
            report.records_without_texts.append((t, d))
        elif rec.status == "ready" and rec.cache_key and not all(store.blobs.contains(k) for k in rec.cache_keys):
            report.missing_caches.append((t, d, rec.cache_key))
    for (t, d), text in sorted(texts.items()):
        if isinstance(text, CorruptEntry):
            report.corrupt_texts.append((t, d))
        elif (t, d) not in records:
            report.texts_without_records.append((t, d))
    report.unencodable = _unencodable(records, texts)
    report.unreferenced_caches = _unreferenced(store, records, min_age_s, clock(), report.untracked_caches)
    if repair:
        _repair(store, report, texts, engine, min_age_s, clock)
    return report


def _unencodable(records: dict, texts: dict) -> list[tuple[str, str]]:
    """``(tenant, doc_id)`` of intact records or texts whose title, metadata or text no encoder accepts."""
    bad = {key for key, rec in records.items()
           if not is_corrupt(rec) and _any_unencodable(rec.title, rec.metadata)}
    bad |= {key for key, entry in texts.items() if isinstance(entry, dict)
            and _any_unencodable(entry.get("text"), entry.get("title"), entry.get("metadata"))}
    return sorted(bad)


def _any_unencodable(*values) -> bool:
    return any(find_unencodable(v) for v in values)


def _repair_unencodable(store, t: str, d: str, entry) -> None:
    """Rewrite one document's title and metadata sanitised; a text that is not valid Unicode is deleted and
    the record marked ``failed``."""
    index = store.index
    rec = index.get(t, d)
    if rec is not None and not is_corrupt(rec):
        rec = index.set_status(t, d, rec.status, title=sanitised(rec.title), metadata=sanitised(rec.metadata))
    if not isinstance(entry, dict):
        return
    found = find_unencodable(entry["text"], "text")
    if found:
        store.texts.delete(t, d)
        if rec is not None and not is_corrupt(rec):
            index.set_status(t, d, "failed", metadata={**rec.metadata, "error": f"stored text is not valid "
                                                       f"Unicode ({found[1]}); re-ingest the document"})
    else:
        store.texts.put(t, d, entry["version"], entry["text"], sanitised(entry.get("title", "")),
                        sanitised(entry.get("metadata", {})))


def _repair(store, report: CheckReport, texts: dict, engine: CacheKeying | None, min_age_s: float, clock) -> None:
    for t, d in report.unencodable:
        _repair_unencodable(store, t, d, texts.get((t, d)))
    index, catalog = store.index, store.catalog
    for t, d in report.texts_without_records + report.corrupt_records:
        text = texts.get((t, d))
        if text is not None and not isinstance(text, CorruptEntry):
            restore_record(store, t, d, text, engine)
        else:  # nothing to rebuild it from: keep it visible as failed
            index.upsert(DocumentRecord(doc_id=d, tenant=t, status="failed", version=0,
                                        metadata={"error": "index record was corrupt and the text is unreadable; "
                                                           "re-ingest the document"}))
    for t, d in report.corrupt_texts:
        err = texts[(t, d)]
        store.texts.delete(t, d)
        rec = index.get(t, d)
        if rec is not None and not is_corrupt(rec):
            index.set_status(t, d, "failed", metadata={**rec.metadata, "error": str(err)})
    for t, d in report.records_without_texts:
        rec = index.get(t, d)
        if rec is not None and not is_corrupt(rec):
            index.set_status(t, d, "failed", metadata={**rec.metadata, "error": TEXT_MISSING})
    for t, d, key in report.missing_caches:
        rec = index.set_status(t, d, "queued", cache_key="") if index.get(t, d) else None
        if rec is not None:
            catalog.enqueue(t, d, rec.version)
    records, _ = _scan(store)  # recreated records may point at caches now
    for key, _ in _unreferenced(store, records, min_age_s, clock()):
        catalog.drop_cache(key)
    report.repaired = True

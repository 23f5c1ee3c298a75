"""The document index inside the blob store's LMDB environment (no server needed).

Sub-databases (all keys are UTF-8, parts joined by NUL, which ids may not contain):

- ``index``:       ``tenant \\0 doc_id``                  -> checksummed JSON of :class:`DocumentRecord`
  (:func:`store.integrity.seal`; a corrupt one reads as a failed :class:`CorruptDocumentRecord`)
- ``index_band``:  ``tenant \\0 b{band}{value:04x} \\0 doc_id`` -> 8-byte big-endian simhash
- ``index_hash``:  ``tenant \\0 content_hash \\0 doc_id``   -> b""
- ``index_ckey``:  ``cache_key \\0 tenant \\0 doc_id``      -> b""

Every mutation runs in one LMDB write transaction, so records and their secondary entries change
together, also across processes sharing the folder.
"""

from __future__ import annotations

import json
import time
from typing import Any

from store.index.document_index import (DocumentIndex, DocumentRecord, apply_fields, bands, check_id,
                                        check_status, is_corrupt)
from store.integrity import CorruptEntry, load_json, seal
from store.lmdb_env import LmdbEnv

RECORDS_DB = b"index"
BANDS_DB = b"index_band"
HASHES_DB = b"index_hash"
CKEYS_DB = b"index_ckey"
_SEP = "\0"


def _k(*parts: str) -> bytes:
    return _SEP.join(parts).encode()


def _scan(txn, db, prefix: bytes, values: bool = False):
    """Keys (or ``(key, value)``) starting with ``prefix``, in order."""
    cur = txn.cursor(db=db)
    if not cur.set_range(prefix):
        return
    for k, v in cur:
        k = bytes(k)
        if not k.startswith(prefix):
            return
        yield (k, bytes(v)) if values else k


class EmbeddedIndex(DocumentIndex):
    """:class:`DocumentIndex` in named sub-databases of ``env``.

    Args:
        env: the store's :class:`LmdbEnv` (see :func:`store.lmdb_env.open_env`).
        clock: unix-seconds clock.
    """

    def __init__(self, env: LmdbEnv, clock=time.time) -> None:
        super().__init__(clock)
        self.env = env
        self._rec = env.db(RECORDS_DB)
        self._band = env.db(BANDS_DB)
        self._hash = env.db(HASHES_DB)
        self._ckey = env.db(CKEYS_DB)

    # -- helpers (inside a transaction) ------------------------------------------------------------
    def _load(self, txn, tenant: str, doc_id: str) -> DocumentRecord | None:
        buf = txn.get(_k(tenant, doc_id), db=self._rec)
        return None if buf is None else self._parse(tenant, doc_id, buf)

    def _parse(self, tenant: str, doc_id: str, buf) -> DocumentRecord:
        """The record in ``buf``, or a :class:`CorruptDocumentRecord` (counted) when it is corrupt."""
        try:
            rec = DocumentRecord.from_dict(load_json(buf, "index record"))
            if (rec.tenant, rec.doc_id) != (tenant, doc_id):
                raise CorruptEntry("index record", "ids differ from its key")
            return rec
        except CorruptEntry as e:
            return self._corrupt(tenant, doc_id, e.reason)
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            return self._corrupt(tenant, doc_id, f"fields: {type(e).__name__}")

    def _unlink(self, txn, rec: DocumentRecord) -> None:
        if is_corrupt(rec):  # the lost record's secondary entries are unknown: find them by doc id
            self._purge(txn, rec.tenant, rec.doc_id)
            return
        for i, v in bands(rec.simhash):
            txn.delete(_k(rec.tenant, f"b{i}{v:04x}", rec.doc_id), db=self._band)
        if rec.content_hash:
            txn.delete(_k(rec.tenant, rec.content_hash, rec.doc_id), db=self._hash)
        for key in rec.cache_keys:
            txn.delete(_k(key, rec.tenant, rec.doc_id), db=self._ckey)

    def _purge(self, txn, tenant: str, doc_id: str) -> None:
        """Delete every secondary entry of ``doc_id`` (scans the tenant's bands and hashes and all cache keys)."""
        tail = _SEP.encode() + doc_id.encode()
        for db, prefix in ((self._band, _k(tenant, "")), (self._hash, _k(tenant, "")), (self._ckey, b"")):
            for k in list(_scan(txn, db, prefix)):
                if k.endswith(tail) and (db is not self._ckey or k.split(b"\0")[1] == tenant.encode()):
                    txn.delete(k, db=db)

    def _store(self, txn, rec: DocumentRecord, old: DocumentRecord | None) -> None:
        if old is not None:
            self._unlink(txn, old)
        txn.put(_k(rec.tenant, rec.doc_id), seal(json.dumps(rec.to_dict()).encode()), db=self._rec)
        sh = rec.simhash.to_bytes(8, "big")
        for i, v in bands(rec.simhash):
            txn.put(_k(rec.tenant, f"b{i}{v:04x}", rec.doc_id), sh, db=self._band)
        if rec.content_hash:
            txn.put(_k(rec.tenant, rec.content_hash, rec.doc_id), b"", db=self._hash)
        for key in rec.cache_keys:
            txn.put(_k(key, rec.tenant, rec.doc_id), b"", db=self._ckey)

    # -- interface ---------------------------------------------------------------------------------
    def swap(self, record: DocumentRecord) -> tuple[DocumentRecord, DocumentRecord | None]:
        now = self.clock()

        def write(txn) -> tuple[DocumentRecord, DocumentRecord | None]:
            old = self._load(txn, record.tenant, record.doc_id)
            created = old.created if old is not None else (record.created or now)
            hits = old.hits if old is not None else record.hits
            rec = apply_fields(record, {"created": created, "updated": now, "hits": hits})
            self._store(txn, rec, old)
            return rec, old

        return self.env.write(write)

    def get(self, tenant: str, doc_id: str) -> DocumentRecord | None:
        with self.env.read() as txn:
            return self._load(txn, tenant, doc_id)

    def pop(self, tenant: str, doc_id: str) -> DocumentRecord | None:
        def write(txn) -> DocumentRecord | None:
            old = self._load(txn, tenant, doc_id)
            if old is None:
                return None
            self._unlink(txn, old)
            txn.delete(_k(tenant, doc_id), db=self._rec)
            return old

        return self.env.write(write)

    def list(self, tenant: str, offset: int = 0, limit: int = 100) -> list[DocumentRecord]:
        check_id("tenant", tenant)
        out: list[DocumentRecord] = []
        with self.env.read() as txn:
            for n, (k, v) in enumerate(_scan(txn, self._rec, _k(tenant, ""), values=True)):
                if n < offset:
                    continue
                if len(out) >= limit:
                    break
                out.append(self._parse(tenant, k.split(b"\0", 1)[1].decode(), v))
        return out

    def count(self, tenant: str) -> int:
        with self.env.read() as txn:
            return sum(1 for _ in _scan(txn, self._rec, _k(tenant, "")))

    def tenants(self) -> list[str]:
        seen: list[str] = []
        with self.env.read() as txn:
            cur = txn.cursor(db=self._rec)
            ok = cur.first()
            while ok:
                tenant = bytes(cur.key()).split(b"\0", 1)[0]
                seen.append(tenant.decode())
                ok = cur.set_range(tenant + b"\x01")  # jump past this tenant's records
        return seen

    def set_status(
        self, tenant: str, doc_id: str, status: str, /, version: int | None = None, **fields: Any
    ) -> DocumentRecord | None:
        check_status(status)
        now = self.clock()

        def write(txn) -> DocumentRecord | None:
            old = self._load(txn, tenant, doc_id)
            if old is None or is_corrupt(old) or (version is not None and old.version != version):
                return None
            rec = apply_fields(old, {**fields, "status": status, "updated": now})
            self._store(txn, rec, old)
            return rec

        return self.env.write(write)

    def incr_hits(self, tenant: str, doc_id: str, n: int = 1) -> int | None:
        def write(txn) -> int | None:
            old = self._load(txn, tenant, doc_id)
            if old is None or is_corrupt(old):
                return None
            old.hits += n
            txn.put(_k(tenant, doc_id), seal(json.dumps(old.to_dict()).encode()), db=self._rec)
            return old.hits

        return self.env.write(write)

    def find_by_content_hash(self, tenant: str, content_hash: str) -> list[DocumentRecord]:
        with self.env.read() as txn:
            ids = [k.rsplit(b"\0", 1)[1].decode() for k in _scan(txn, self._hash, _k(tenant, content_hash, ""))]
            return [r for r in (self._load(txn, tenant, d) for d in ids) if r is not None and not is_corrupt(r)]

    def find_by_cache_key(self, cache_key: str) -> list[tuple[str, str]]:
        with self.env.read() as txn:
            rows = [k.decode().split(_SEP)[1:] for k in _scan(txn, self._ckey, _k(cache_key, ""))]
        return sorted((t, d) for t, d in rows)

    def _band_candidates(self, tenant: str, simhash: int) -> dict[str, int]:
        out: dict[str, int] = {}
        with self.env.read() as txn:
            for i, v in bands(simhash):
                for k, sh in _scan(txn, self._band, _k(tenant, f"b{i}{v:04x}", ""), values=True):
                    out[k.rsplit(b"\0", 1)[1].decode()] = int.from_bytes(sh, "big")
        return out

    def _all_simhashes(self, tenant: str) -> dict[str, int]:
        with self.env.read() as txn:
            recs = (self._parse(tenant, k.split(b"\0", 1)[1].decode(), v)
                    for k, v in _scan(txn, self._rec, _k(tenant, ""), values=True))
            return {r.doc_id: r.simhash for r in recs if not is_corrupt(r)}

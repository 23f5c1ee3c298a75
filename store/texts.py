"""Document texts by (tenant, document id): the :class:`Texts` interface and its LMDB backend
(:class:`TextStore`, the ``texts`` sub-database of the store's LMDB env; the Redis one, used when the index
is in Redis so that every host reads the same texts, is :class:`store.redis_texts.RedisTextStore`).

Workers read the text to encode from here; the version guards against encoding an outdated text. Each
value is checksummed (:mod:`store.integrity`) and also holds the title and metadata, so the document
index can be rebuilt from the texts alone (:func:`store.recovery.rebuild_index`).
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterator

from store.integrity import CorruptEntry, load_json, seal
from store.lmdb_env import LmdbEnv

log = logging.getLogger(__name__)
TEXTS_DB = b"texts"


def _k(tenant: str, doc_id: str) -> bytes:
    return f"{tenant}\0{doc_id}".encode()


class Texts(ABC):
    """``put``/``get``/``delete`` of ``{"version", "text", "title", "metadata"}`` per document; a backend
    stores sealed bytes (:func:`store.integrity.seal`) under ``(tenant, doc_id)``.

    Attributes:
        corrupt_reads: reads that found a corrupt entry (exported as a metric).
    """

    corrupt_reads: int = 0

    @abstractmethod
    def _put_raw(self, tenant: str, doc_id: str, value: bytes) -> None:
        """Store the sealed ``value``."""

    @abstractmethod
    def _get_raw(self, tenant: str, doc_id: str) -> bytes | None:
        """The sealed value, or None."""

    @abstractmethod
    def _raw_items(self) -> Iterator[tuple[str, str, bytes]]:
        """``(tenant, doc_id, sealed value)`` of every text, in ``(tenant, doc_id)`` code-point order."""

    @abstractmethod
    def empty(self) -> bool:
        """True when no text is stored."""

    @abstractmethod
    def delete(self, tenant: str, doc_id: str) -> bool:
        """Remove; True if it existed."""

    def put(self, tenant: str, doc_id: str, version: int, text: str, title: str = "",
            metadata: dict | None = None) -> None:
        """Store (replacing) the text of version ``version``, checksummed."""
        value = json.dumps({"version": version, "text": text, "title": title, "metadata": metadata or {}}).encode()
        self._put_raw(tenant, doc_id, seal(value))

    def get(self, tenant: str, doc_id: str) -> dict | None:
        """``{"version", "text", "title", "metadata"}`` or None.

        Raises:
            store.integrity.CorruptEntry: the stored entry failed its checksum (counted in
                :attr:`corrupt_reads`); never a silently altered text.
        """
        raw = self._get_raw(tenant, doc_id)
        return None if raw is None else self._parse(tenant, doc_id, raw)

    def last_known(self, tenant: str, doc_id: str) -> dict | None:
        """The text as last known to this host (:meth:`get_intact` here; a backend with a local mirror falls
        back to it), for callers that remove what it points at."""
        return self.get_intact(tenant, doc_id)

    def get_intact(self, tenant: str, doc_id: str) -> dict | None:
        """:meth:`get`, with None for a corrupt entry too (still counted and logged) for callers that
        rewrite, skip or delete it rather than report it."""
        try:
            return self.get(tenant, doc_id)
        except CorruptEntry:
            return None

    def _parse(self, tenant: str, doc_id: str, raw: bytes) -> dict:
        try:
            d = load_json(raw, f"stored text of document {doc_id!r}")
            if not isinstance(d.get("text"), str) or not isinstance(d.get("version"), int):
                raise CorruptEntry(f"stored text of document {doc_id!r}", "fields")
        except CorruptEntry as e:
            self.corrupt_reads += 1
            log.warning("tenant %s: %s", tenant, e)
            raise
        d.setdefault("title", "")
        d.setdefault("metadata", {})
        return d

    def items(self) -> Iterator[tuple[str, str, dict | CorruptEntry]]:
        """``(tenant, doc_id, stored)`` of every text in key order; ``stored`` is the
        :class:`CorruptEntry` instead when the entry is corrupt (so a scan never stops on one)."""
        for tenant, doc_id, raw in self._raw_items():
            try:
                yield tenant, doc_id, self._parse(tenant, doc_id, raw)
            except CorruptEntry as e:
                yield tenant, doc_id, e


class TextStore(Texts):
    """:class:`Texts` in the ``texts`` sub-database of an LMDB environment."""

    def __init__(self, env: LmdbEnv):
        self.env = env
        self._db = env.db(TEXTS_DB)
        self.corrupt_reads = 0

    def _put_raw(self, tenant: str, doc_id: str, value: bytes) -> None:
        self.env.write(lambda txn: txn.put(_k(tenant, doc_id), value, db=self._db))

    def _get_raw(self, tenant: str, doc_id: str) -> bytes | None:
        with self.env.read() as txn:
            raw = txn.get(_k(tenant, doc_id), db=self._db)
            return None if raw is None else bytes(raw)

    def _raw_items(self) -> Iterator[tuple[str, str, bytes]]:
        start = b""
        while True:
            with self.env.read() as txn:  # pages of 256, no read transaction held while the caller works
                cur = txn.cursor(db=self._db)
                rows = []
                ok = cur.set_range(start)
                while ok and len(rows) < 256:
                    rows.append((bytes(cur.key()), bytes(cur.value())))
                    ok = cur.next()
            for k, v in rows:
                tenant, _, doc_id = k.decode("utf-8", "replace").partition("\0")
                yield tenant, doc_id, v
            if len(rows) < 256:
                return
            start = rows[-1][0] + b"\0"

    def empty(self) -> bool:
        """True when no text is stored."""
        with self.env.read() as txn:
            return not txn.cursor(db=self._db).first()

    def delete(self, tenant: str, doc_id: str) -> bool:
        """Remove; True if it existed."""
        return bool(self.env.write(lambda txn: txn.delete(_k(tenant, doc_id), db=self._db)))

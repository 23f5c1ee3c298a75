"""Document texts by (tenant, document id), in the ``texts`` sub-database of the shared LMDB env.

Workers read the text to encode from here; the version guards against encoding an outdated text.
"""

from __future__ import annotations

import json

from store.lmdb_env import LmdbEnv

TEXTS_DB = b"texts"


def _k(tenant: str, doc_id: str) -> bytes:
    return f"{tenant}\0{doc_id}".encode()


class TextStore:
    """``put``/``get``/``delete`` of ``{"version", "text", "title"}`` per document."""

    def __init__(self, env: LmdbEnv):
        self.env = env
        self._db = env.db(TEXTS_DB)

    def put(self, tenant: str, doc_id: str, version: int, text: str, title: str = "") -> None:
        """Store (replacing) the text of version ``version``."""
        value = json.dumps({"version": version, "text": text, "title": title}).encode()
        self.env.write(lambda txn: txn.put(_k(tenant, doc_id), value, db=self._db))

    def get(self, tenant: str, doc_id: str) -> dict | None:
        """``{"version", "text", "title"}`` or None."""
        with self.env.read() as txn:
            raw = txn.get(_k(tenant, doc_id), db=self._db)
        return None if raw is None else json.loads(bytes(raw))

    def delete(self, tenant: str, doc_id: str) -> bool:
        """Remove; True if it existed."""
        return bool(self.env.write(lambda txn: txn.delete(_k(tenant, doc_id), db=self._db)))

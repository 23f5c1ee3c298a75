"""How the LMDB blob store lays out one document's record in its ``blobs`` sub-database, and the reads and
writes of it inside one transaction (the transactions themselves, corruption handling and eviction are
:class:`store.blobs.lmdb.LmdbBlobStore`'s).

Records live in the ``blobs`` sub-database of one :class:`~store.lmdb_env.LmdbEnv` (shared with the
embedded index), under the cache key (see :func:`store.keys.cache_key`)::

    <key>/meta   JSON: format_version, dtype, source_dtype, key_axis, shape [L, H, T, D], fingerprint,
                 encoding, num_tokens, nbytes, checksum {ids, layers[L]} (xxh3_64 hex; xxh64 in version-1 records), created
    <key>/ids    int64 little-endian token ids, T * 8 bytes
    <key>/L{l}   safetensors bytes of layer l (see :mod:`store.records.codec`); a document stored with importance
                 scores has its tokens in retention order, token-major, with per-tenth chunk checksums in
                 the meta (``token_order``, ``checksum.chunks``; :mod:`store.records.ordered_layout`), so a read at
                 retention r touches only the first ~r of each layer's bytes

Every function takes an open LMDB transaction ``txn`` and the ``blobs`` database handle ``db``.
"""

from __future__ import annotations

import json

import numpy as np
import torch

from kvlink_rag.rows import RowWriter, StoredRows
from kvlink_rag.types import DocumentKV
from store.blobs.blob_store import RawRecord
from store.records import codec, ordered_layout
from store.records.errors import CorruptRecordError
from store.records.layer_decode import decode_document, decode_layer_into
from store.records.stored_order import decode_layer_stored_into, rows_plan
from store.records.verified import VERIFIED

BLOBS_DB = b"blobs"
MAX_KEY_BYTES = 400


def rkey(key: str, part: str) -> bytes:
    """The LMDB key of ``part`` (``meta``, ``ids``, ``L{l}``) of cache key ``key``."""
    return f"{key}/{part}".encode()


def check_key(key: str) -> bytes:
    """``key`` as bytes.

    Raises:
        ValueError: empty, with a ``/`` or longer than :data:`MAX_KEY_BYTES` bytes.
    """
    raw = key.encode()
    if not key or "/" in key or len(raw) > MAX_KEY_BYTES:
        raise ValueError(f"invalid cache key {key!r}: non-empty, no '/', at most {MAX_KEY_BYTES} bytes")
    return raw


def put_record(txn, db, key: str, record: RawRecord) -> None:
    """Write the meta, ids and layer records of ``record`` under ``key`` (delete an earlier one first)."""
    txn.put(rkey(key, "meta"), json.dumps(record.meta).encode(), db=db)
    txn.put(rkey(key, "ids"), record.ids, db=db)
    for i, payload in enumerate(record.layers):
        txn.put(rkey(key, f"L{i}"), payload, db=db)


def delete_record(txn, db, key: str) -> bool:
    """Delete every record of ``key`` (layers by prefix when the meta is absent or unreadable); True if any
    existed."""
    meta_buf = txn.get(rkey(key, "meta"), db=db)
    existed = meta_buf is not None
    n_layers = 0
    if existed:
        try:
            n_layers = codec.parse_meta(meta_buf)["shape"][0]
        except CorruptRecordError:
            n_layers = 0
    txn.delete(rkey(key, "meta"), db=db)
    txn.delete(rkey(key, "ids"), db=db)
    for i in range(n_layers):
        txn.delete(rkey(key, f"L{i}"), db=db)
    if not n_layers:  # meta unreadable or absent: sweep every layer record by prefix
        cur = txn.cursor(db=db)
        prefix = rkey(key, "L")
        while cur.set_range(prefix) and bytes(cur.key()).startswith(prefix):
            cur.delete()
            existed = True
    return existed


def read_meta(txn, db, key: str) -> dict | None:
    """Parsed meta of ``key``; None when absent or written by a newer format version.

    Raises:
        CorruptRecordError: the meta record cannot be parsed.
    """
    buf = txn.get(rkey(key, "meta"), db=db)
    if buf is None:
        return None
    meta = codec.parse_meta(buf)
    return None if meta["format_version"] > codec.FORMAT_VERSION else meta  # newer release: leave it


def read_ids(txn, db, key: str, meta: dict) -> torch.Tensor:
    """``[tokens]`` int64 token ids of ``key`` (checksummed). Raises CorruptRecordError."""
    return codec.decode_ids(txn.get(rkey(key, "ids"), db=db), meta)


def read_document(txn, db, key: str, dtype: torch.dtype | str | None) -> DocumentKV | None:
    """The whole document of ``key`` on CPU (``dtype``: as :meth:`BlobStore.get`), or None when absent.

    Raises:
        CorruptRecordError: the meta, the ids or a layer failed its checks.
    """
    meta = read_meta(txn, db, key)
    if meta is None:
        return None
    layers = (txn.get(rkey(key, f"L{i}"), db=db) for i in range(meta["shape"][0]))
    return decode_document(meta, txn.get(rkey(key, "ids"), db=db), layers, dtype)


def _same_meta(txn, db, key: str, meta_bytes: bytes) -> None:
    now_meta = txn.get(rkey(key, "meta"), db=db)
    if now_meta is None or bytes(now_meta) != meta_bytes:
        raise KeyError(f"{key} changed while its layers were read")


def read_layer_into(txn, db, key: str, meta_bytes: bytes, meta: dict, layer: int, k: torch.Tensor,
                    v: torch.Tensor) -> None:
    """Decode layer ``layer`` of ``key`` into ``k``/``v`` ``[H, T, D]``.

    Raises:
        KeyError: the record is no longer the one whose meta is ``meta_bytes``. CorruptRecordError: bad layer.
    """
    _same_meta(txn, db, key, meta_bytes)
    decode_layer_into(txn.get(rkey(key, f"L{layer}"), db=db), meta, layer, k, v)


def _layer_buffer(txn, db, key: str, meta_bytes: bytes, meta: dict, layer: int
                  ) -> tuple[np.ndarray | None, tuple | None]:
    """Layer ``layer``'s bytes of ``key`` as a flat uint8 view of the memory map (no copy; None: missing) and its
    place for :data:`VERIFIED` (None without a buffer), after checking the record is still the one whose meta is
    ``meta_bytes``.

    Raises:
        KeyError: the record changed.
    """
    _same_meta(txn, db, key, meta_bytes)
    buf = txn.get(rkey(key, f"L{layer}"), db=db)
    if buf is None:
        return None, None
    raw = np.frombuffer(buf, dtype=np.uint8)
    return raw, VERIFIED.token(key, layer, raw, meta["checksum"]["layers"][layer])


def read_layer_stored_into(txn, db, key: str, meta_bytes: bytes, meta: dict, layer: int, k: torch.Tensor,
                           v: torch.Tensor, keys: RowWriter | None = None, values: RowWriter | None = None,
                           start: int = 0) -> None:
    """Decode layer ``layer`` of ``key`` into ``k``/``v`` ``[H, T, D]`` in its stored token order, through the
    writers when given (:func:`store.records.stored_order.decode_layer_stored_into`); a layer this process has
    verified at the same place of the memory map is not hashed again (:data:`VERIFIED`).

    Raises:
        KeyError: the record changed (as :func:`read_layer_into`). CorruptRecordError: bad layer.
    """
    buf, seen = _layer_buffer(txn, db, key, meta_bytes, meta, layer)
    decode_layer_stored_into(buf, meta, layer, k, v, keys, values, start, verified=seen in VERIFIED)
    VERIFIED.add(seen)


def stage_layer_stored(txn, db, key: str, meta_bytes: bytes, meta: dict, layer: int, dtype: torch.dtype,
                       shape: tuple[int, int, int], start: int) -> tuple[StoredRows, StoredRows] | None:
    """Layer ``layer`` of ``key`` verified and handed over as the rows of its buffer (valid while ``txn`` is open),
    or None where it must be decoded (:func:`store.records.stored_order.rows_plan`); a layer this process has
    verified at the same place of the memory map is neither hashed nor parsed again (:data:`VERIFIED` keeps where
    its rows lie: a hot document's layer costs two lookups and two views).

    Raises:
        KeyError: the record changed (as :func:`read_layer_into`). CorruptRecordError: bad layer.
    """
    raw, seen = _layer_buffer(txn, db, key, meta_bytes, meta, layer)
    if raw is None:
        raise CorruptRecordError(f"layer {layer} failed its checksum")
    plan = VERIFIED.plan(seen)
    if plan is None or plan.dtype != dtype or plan.shape != tuple(shape):
        plan = rows_plan(raw, meta, layer, dtype, shape, verified=seen in VERIFIED)
        if plan is None:  # another dtype: returned before its checksum, nothing verified
            return None
        VERIFIED.add(seen, plan)
    return plan.parts(raw, start)


def read_layer_prefix(txn, db, key: str, meta_bytes: bytes, meta: dict, layer: int, retention: float,
                      dtype: torch.dtype, order: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k, v)`` ``[H, kept, D]`` of layer ``layer`` from the prefix of its importance-ordered record that holds
    the tokens ``retention`` keeps (the memoryview is touched only there).

    Raises:
        KeyError: the record changed (as :func:`read_layer_into`). CorruptRecordError: missing or bad chunk.
    """
    _same_meta(txn, db, key, meta_bytes)
    buf = txn.get(rkey(key, f"L{layer}"), db=db)
    if buf is None:
        raise CorruptRecordError(f"layer {layer} is missing")
    return ordered_layout.decode_ordered_prefix(buf, meta, layer, retention, dtype, order)

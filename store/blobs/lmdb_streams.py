"""Reading an LMDB record layer by layer (what a query's linker consumes while later layers are read): one
short read transaction per layer, so no transaction is held while the consumer works and the map can grow
meanwhile. Each layer's transaction first checks that the record is still the one whose meta was read
(replaced or deleted meanwhile: KeyError); an importance-ordered record read at a retention touches only the
prefix of each layer that holds the kept tokens.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager, nullcontext
from collections.abc import Callable, Iterator

import torch

from kvlink_rag.rows import RowWriter, StoredRows, add_parts
from store.blobs import lmdb_records as records
from store.blobs.blob_store import LayerFill
from store.blobs.lmdb_records import check_key, rkey
from store.lmdb_env import LmdbEnv
from store.records import codec, ordered_layout
from store.records.errors import CorruptRecordError

Layers = Iterator[tuple[torch.Tensor, torch.Tensor]]


class _Session(threading.local):
    txn = None  # this thread's read transaction of an open :meth:`LayerStreams.session`
    pending: list | None = None  # (key, error) of records found corrupt in it: deleted once it closes


class LayerStreams:
    """Layer streams of the records in one ``blobs`` database.

    Args:
        env: the environment. db: its ``blobs`` database.
        corrupt: called with ``(key, error)`` when a record fails its checks (deletes and reports it).
        touch: called with the key's bytes once a stream has read every layer (access stats).
    """

    def __init__(self, env: LmdbEnv, db, corrupt: Callable[[str, Exception], None],
                 touch: Callable[[bytes], None]) -> None:
        self.env, self.db, self.corrupt, self.touch = env, db, corrupt, touch
        self._session = _Session()

    @contextmanager
    def session(self) -> Iterator[None]:
        """This thread's fills inside share one read transaction (a layer of every document: tens of
        microseconds, no writer waits on it); nested, the outer one serves."""
        if self._session.txn is not None:
            yield
            return
        pending: list[tuple[str, Exception]] = []
        try:
            with self.env.read() as txn:
                self._session.txn, self._session.pending = txn, pending
                try:
                    yield
                finally:
                    self._session.txn = self._session.pending = None
        finally:  # a corrupt record is deleted (a write) only once the read transaction is closed
            for key, err in pending:
                self.corrupt(key, err)

    def stored_meta(self, key: str) -> tuple[bytes, dict]:
        """The raw and parsed meta record of ``key``.

        Raises:
            KeyError: absent. CorruptRecordError: unparsable (the record is deleted and reported).
        """
        check_key(key)
        with self.env.read() as txn:
            buf = txn.get(rkey(key, "meta"), db=self.db)
            meta_bytes = None if buf is None else bytes(buf)
        if meta_bytes is None:
            raise KeyError(key)
        try:
            return meta_bytes, codec.parse_meta(meta_bytes)
        except CorruptRecordError as e:
            self.corrupt(key, e)
            raise

    def layers(self, key: str, dtype: torch.dtype | str | None = None) -> Layers:
        """``(k, v)`` ``[H, T, D]`` of each layer of ``key`` in ``dtype`` (default: as stored).

        Raises:
            KeyError: absent, or changed while read. CorruptRecordError: a bad layer (deleted and reported).
        """
        meta_bytes, meta = self.stored_meta(key)
        L, H, T, D = meta["shape"]
        out_dtype = codec.target_dtype(meta, dtype)

        def read(txn, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            k, v = torch.empty((H, T, D), dtype=out_dtype), torch.empty((H, T, D), dtype=out_dtype)
            records.read_layer_into(txn, self.db, key, meta_bytes, meta, i, k, v)
            return k, v

        yield from self._stream(key, L, read)

    def stored(self, key: str) -> tuple[torch.Tensor | None, Iterator[LayerFill]]:
        """:meth:`store.blobs.blob_store.BlobStore.iter_stored_layers` from LMDB: the stored rows' offsets (None
        for a record in position order) and one fill per layer, each decoding in its own short read transaction
        straight into the caller's buffers.

        Raises:
            KeyError: absent (here), or changed while read (from a fill). CorruptRecordError: a bad order (here)
            or layer (from its fill); the record is deleted and reported.
        """
        meta_bytes, meta = self.stored_meta(key)
        try:
            order = ordered_layout.token_order(meta)
        except CorruptRecordError as e:
            self.corrupt(key, e)
            raise
        return order, self._fills(key, meta_bytes, meta)

    def _fills(self, key: str, meta_bytes: bytes, meta: dict) -> Iterator[LayerFill]:
        for i in range(meta["shape"][0]):
            yield _StoredLayer(self, key, meta_bytes, meta, i)
        self.touch(key.encode())

    def _fill(self, key: str, meta_bytes: bytes, meta: dict, layer: int, k_out: torch.Tensor,
              v_out: torch.Tensor, keys: RowWriter | None = None, values: RowWriter | None = None,
              start: int = 0) -> None:
        self._read(key, records.read_layer_stored_into, key, meta_bytes, meta, layer, k_out, v_out, keys, values,
                   start)

    def _stage(self, key: str, meta_bytes: bytes, meta: dict, layer: int, dtype: torch.dtype,
               shape: tuple[int, int, int], start: int) -> tuple[StoredRows, StoredRows] | None:
        if self._session.pending is None:  # no session: the rows would not outlive their transaction
            return None
        return self._read(key, records.stage_layer_stored, key, meta_bytes, meta, layer, dtype, shape, start)

    def _read(self, key: str, read, *args):
        """``read(txn, db, *args)`` in this thread's session's transaction (a corrupt record deleted once it
        closes) or in a short one of its own (deleted at once). Arguments, not a closure: this runs once per
        document and layer of every load."""
        pending = self._session.pending  # inside a session: its transaction, and a corrupt record deleted after it
        try:
            with nullcontext(self._session.txn) if pending is not None else self.env.read() as txn:
                return read(txn, self.db, *args)
        except CorruptRecordError as e:
            if pending is None:
                self.corrupt(key, e)
            else:
                pending.append((key, e))
            raise

    def retained(self, key: str, retention: float, dtype: torch.dtype | str | None = None
                 ) -> tuple[torch.Tensor, Layers] | None:
        """``(kept positions, (k, v) [H, kept, D] per layer)`` read from the prefixes of an importance-ordered
        record (the bytes read scale with ``retention``; the chunks read are verified against their
        checksums); None when the record has no order (read whole layers instead).

        Raises:
            KeyError: absent. ValueError: retention outside (0, 1].
            CorruptRecordError: a bad order or chunk (the record is deleted and reported).
        """
        meta_bytes, meta = self.stored_meta(key)
        if "token_order" not in meta:
            return None
        try:
            pos = ordered_layout.retained_positions(meta, retention)
        except CorruptRecordError as e:
            self.corrupt(key, e)
            raise
        return pos, self._prefixes(key, meta_bytes, meta, retention, codec.target_dtype(meta, dtype))

    def _prefixes(self, key: str, meta_bytes: bytes, meta: dict, retention: float, dtype: torch.dtype) -> Layers:
        order = ordered_layout.token_order(meta)  # checked once per document (by retained)
        yield from self._stream(key, meta["shape"][0], lambda txn, i: records.read_layer_prefix(
            txn, self.db, key, meta_bytes, meta, i, retention, dtype, order))

    def _stream(self, key: str, n_layers: int, read) -> Layers:
        """``read(txn, layer)`` of each layer, each in its own short read transaction; a corrupt layer deletes
        and reports the record, then raises; the access is counted once every layer was read."""
        for i in range(n_layers):
            try:
                with self.env.read() as txn:
                    kv = read(txn, i)
            except CorruptRecordError as e:
                self.corrupt(key, e)
                raise
            yield kv
        self.touch(key.encode())


class _StoredLayer:
    """:class:`~store.blobs.blob_store.LayerFill` of one layer of an LMDB record, in its stored token order."""

    __slots__ = ("streams", "key", "meta_bytes", "meta", "layer")

    def __init__(self, streams: LayerStreams, key: str, meta_bytes: bytes, meta: dict, layer: int) -> None:
        self.streams, self.key, self.meta_bytes, self.meta, self.layer = streams, key, meta_bytes, meta, layer

    def __call__(self, k_out: torch.Tensor, v_out: torch.Tensor, keys: RowWriter | None = None,
                 values: RowWriter | None = None, start: int = 0) -> None:
        self.streams._fill(self.key, self.meta_bytes, self.meta, self.layer, k_out, v_out, keys, values, start)

    def stage(self, dtype: torch.dtype, shape: tuple[int, int, int], start: int, k_parts: list[StoredRows],
              v_parts: list[StoredRows]) -> bool:
        """:meth:`~store.blobs.blob_store.LayerFill.stage`: views of the memory map's pages, inside a
        :meth:`LayerStreams.session` only (their transaction must outlive the caller's write)."""
        return add_parts(self.streams._stage(self.key, self.meta_bytes, self.meta, self.layer, dtype, shape, start),
                         k_parts, v_parts)

"""The blob-store interface: where documents' KV caches are kept durably, under their cache keys.

Backends are opened by URL with :func:`store.backends.open_blob_store` (``lmdb://PATH``:
:class:`store.blobs.lmdb.LmdbBlobStore`); callers use only this interface, so a second backend can be
added without touching them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kvlink_rag.rows import StoredRows, stage_tensors, write_rows

if TYPE_CHECKING:
    import torch

    from kvlink_rag.rows import RowWriter
    from kvlink_rag.types import DocumentKV


class BlobStoreUnavailable(RuntimeError):
    """A blob store on the network (the shared tier) cannot be reached or answered with an error; the
    message names the store. Readers treat it as a miss; writers of the shared tier raise it."""


@dataclass
class RawRecord:
    """One document's record as stored bytes (see :mod:`store.records.codec`): copied between backends without
    decoding (the tiered store fills a host's local tier with exactly the shared tier's bytes).

    Attributes:
        meta: the codec's meta dict (shape ``[L, H, T, D]``, checksums, fingerprint, ...).
        ids: little-endian int64 token ids, ``T * 8`` bytes.
        layers: ``L`` safetensors payloads, one per layer.
    """

    meta: dict
    ids: bytes
    layers: list[bytes]


def encode_record(kv: DocumentKV, int8: bool = False, tracked: bool = True) -> RawRecord:
    """The stored bytes of ``kv`` (keys/values ``[L, H, T, D]``) through the codec's public functions.

    Raises:
        ValueError: invalid document (:func:`store.records.codec.validate`).
    """
    from store.records import codec

    meta, ids, layers = codec.encode_document(kv, int8, tracked)  # importance-ordered layers when scored
    return RawRecord(meta, ids, layers)


class RecordSink(Protocol):
    """A backend that stores a :class:`RawRecord` as it is (atomically, replacing any earlier one)."""

    def put_record(self, key: str, record: RawRecord) -> int:
        """Store ``record`` under ``key``; payload bytes written."""


class RecordSource(RecordSink, Protocol):
    """A backend that hands out a record as its meta and its raw payloads, layer by layer as they arrive."""

    def open_record(self, key: str) -> tuple[dict, bytes, Iterator[bytes]] | None:
        """``(meta, ids bytes, iterator of the L layer payloads)`` or None when absent; the payloads are
        not verified (the caller checks them against ``meta``'s checksums)."""


class LayerFill(Protocol):
    """Decodes one layer of a record into the caller's ``k_out``/``v_out`` ``[H, T, D]`` (views whose rows are
    contiguous per head, such as a slice of a buffer joining several documents; any float dtype), the keys
    through the :class:`~kvlink_rag.types.RowWriter` ``keys`` and the values through ``values`` when given (with
    ``start``, the outputs' first row in the caller's whole fill), else copied as stored.

    Raises:
        KeyError: the record changed since it was opened. store.records.codec.CorruptRecordError: a bad layer.
    """

    def __call__(self, k_out: torch.Tensor, v_out: torch.Tensor, keys: RowWriter | None = None,
                 values: RowWriter | None = None, start: int = 0) -> None: ...

    def stage(self, dtype: torch.dtype, shape: tuple[int, int, int], start: int, k_parts: list[StoredRows],
              v_parts: list[StoredRows]) -> bool:
        """Instead of writing: append the layer's keys and values as :class:`~kvlink_rag.rows.StoredRows` at row
        ``start`` of the fill, for the caller to write every document at once
        (:meth:`~kvlink_rag.rows.RowWriter.write_many`, before the source's read session closes), when they
        are ``shape`` ``[kv_heads, n, head_dim]`` rows of ``dtype`` as stored; else append nothing and return
        False (the caller then calls the fill).

        Raises:
            KeyError, store.records.codec.CorruptRecordError: as a call.
        """
        ...


class DecodedLayer:
    """A :class:`LayerFill` over a layer already decoded (``k``, ``v`` ``[H, T, D]``, position order): what a
    backend without its own stored-order reader streams; a reader may keep ``k``/``v`` (no second read)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k, self.v = k, v

    def __call__(self, k_out: torch.Tensor, v_out: torch.Tensor, keys: RowWriter | None = None,
                 values: RowWriter | None = None, start: int = 0) -> None:
        write_rows(k_out, self.k, keys, start)
        write_rows(v_out, self.v, values, start)

    def stage(self, dtype: torch.dtype, shape: tuple[int, int, int], start: int, k_parts: list[StoredRows],
              v_parts: list[StoredRows]) -> bool:
        """:meth:`LayerFill.stage`: the decoded tensors' own bytes when they are ``shape`` rows of ``dtype``."""
        return stage_tensors(self.k, self.v, dtype, shape, start, k_parts, v_parts)


class BlobStore(ABC):
    """Document KV caches by cache key: whole or layer by layer, checksummed, evicting for space.

    Attributes:
        checksum_failures: records that failed their checksum (and were deleted) since opening.
        evictions: documents evicted for space since opening.
    """

    checksum_failures: int = 0
    evictions: int = 0

    def put(self, key: str, kv: DocumentKV, int8: bool = False, tracked: bool = True) -> int:
        """Store ``kv`` (keys/values ``[L, H, T, D]``) under ``key`` atomically, replacing any earlier record.

        Args:
            int8: store int8 (keys per channel, values per token) instead of ``kv.dtype``.
            tracked: a document record will point at it; False for ad-hoc caches (``ask``, ``demo``),
                which ``store check`` never reports as unreferenced.
        Returns:
            payload bytes written.
        Raises:
            ValueError: invalid key or document.
            store.lmdb_env.StoreFullError: the document does not fit even after evicting every other one.
            BlobStoreUnavailable: a remote backend is unreachable.
        """
        return self.put_record(key, encode_record(kv, int8, tracked))

    def put_record(self, key: str, record: RawRecord) -> int:
        """Store an encoded record (:func:`encode_record`, or one read from another backend) as :meth:`put` does.

        Raises:
            as :meth:`put`; NotImplementedError: a backend that overrides :meth:`put` instead.
        """
        raise NotImplementedError

    @abstractmethod
    def get(self, key: str, dtype: torch.dtype | str | None = None) -> DocumentKV | None:
        """The stored document on CPU (in ``dtype``, default the stored/source dtype), or None when absent
        or corrupt (a corrupt record is deleted and counted in ``checksum_failures``)."""

    @abstractmethod
    def iter_layers(self, key: str, dtype: torch.dtype | str | None = None
                    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(k, v)`` ``[H, T, D]`` per layer.

        Raises:
            KeyError: ``key`` is absent, or was replaced or deleted while iterating.
            store.records.codec.CorruptRecordError: a layer failed its checksum (the record is deleted).
        """

    def iter_retained_layers(self, key: str, retention: float, dtype: torch.dtype | str | None = None
                             ) -> tuple[torch.Tensor, Iterator[tuple[torch.Tensor, torch.Tensor]]]:
        """The tokens a read at ``retention`` keeps (:func:`store.records.ordered_layout.retained_positions`): their
        sorted ``[kept]`` int64 offsets and ``(k, v)`` ``[H, kept, D]`` per layer in that order.

        This default reads whole layers (:meth:`iter_layers`) and gathers; a backend that can read a prefix of
        an importance-ordered record overrides it so that the bytes read scale with ``retention``.

        Raises:
            KeyError: absent. ValueError: retention outside (0, 1]. store.records.codec.CorruptRecordError: as
            :meth:`iter_layers`.
        """
        from store.records.ordered_layout import retained_positions

        meta = self.meta(key)
        if meta is None:
            raise KeyError(key)
        pos = retained_positions(meta, retention)
        return pos, ((k[:, pos], v[:, pos]) for k, v in self.iter_layers(key, dtype))

    def layer_session(self) -> AbstractContextManager[None]:
        """A scope in which this thread's layer fills (:meth:`iter_stored_layers`) may share one read: LMDB reads
        every document's layer in one transaction instead of one each. This default shares nothing."""
        return nullcontext()

    def iter_stored_layers(self, key: str) -> tuple[torch.Tensor | None, Iterator[LayerFill]]:
        """The record's layers in its stored token order, for a reader that carries positions as data instead of
        gathering them back: ``(offsets, fills)``, ``offsets`` the ``[T]`` int64 position within the document of
        each stored row (an importance-ordered record's ``token_order``; None: position order) and one
        :class:`LayerFill` per layer, in layer order, each called once before the next is drawn.

        This default fills from :meth:`iter_layers` (position order, one extra copy); a backend that can decode a
        record straight into the caller's buffers overrides it.

        Raises:
            KeyError, store.records.codec.CorruptRecordError: as :meth:`iter_layers` (from the fills).
        """
        return None, (DecodedLayer(k, v) for k, v in self.iter_layers(key))

    @abstractmethod
    def get_ids(self, key: str) -> torch.Tensor | None:
        """``[tokens]`` int64 token ids of ``key`` (checksummed), or None when absent.

        Raises:
            store.records.codec.CorruptRecordError: the ids failed their checksum (the record is deleted).
        """

    @abstractmethod
    def meta(self, key: str) -> dict | None:
        """The record's metadata (``shape [L, H, T, D]``, ``fingerprint``, ``encoding``, ``num_tokens``,
        ``nbytes``, ``dtype``, ...), or None when absent."""

    @abstractmethod
    def contains(self, key: str) -> bool:
        """Whether a record for ``key`` exists (payload not verified)."""

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.contains(key)

    @abstractmethod
    def keys(self) -> list[str]:
        """All stored cache keys, sorted."""

    @abstractmethod
    def entries(self) -> dict[str, dict]:
        """Key -> ``{nbytes, created, hits, last_access}`` (bytes, unix seconds) of every stored document."""

    @abstractmethod
    def delete(self, key: str) -> bool:
        """Remove the record of ``key``; True if it existed."""

    @abstractmethod
    def evict(self, bytes_wanted: int) -> int:
        """Delete the least valuable documents until ``bytes_wanted`` payload bytes are freed (or none is
        left); returns the payload bytes freed."""

    @abstractmethod
    def stats(self) -> dict:
        """Counters and sizes (at least ``documents``, ``payload_bytes``, ``used_bytes``,
        ``checksum_failures``, ``evictions``)."""

    @abstractmethod
    def used_bytes(self) -> int:
        """Bytes the backend holds now (cheap: for metrics scrapes)."""

    def events(self) -> dict[str, int]:
        """Counters of what a tiered or networked backend did (``local_hit``, ``shared_hit``, ``miss``,
        ``fenced``, ``shared_error``, ``missing``, ``corrupt``, ...), for metrics; none by default."""
        return {}

    @abstractmethod
    def ping(self) -> None:
        """Raise if the store cannot be read (readiness check)."""

    @abstractmethod
    def close(self) -> None:
        """Flush buffered state and release what this handle holds."""

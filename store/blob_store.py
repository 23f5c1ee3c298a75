"""The blob-store interface: where documents' KV caches are kept durably, under their cache keys.

Backends are opened by URL with :func:`store.backends.open_blob_store` (``lmdb://PATH``:
:class:`store.lmdb_blobs.LmdbBlobStore`); callers use only this interface, so a second backend can be
added without touching them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from kvlink_rag.types import DocumentKV


class BlobStore(ABC):
    """Document KV caches by cache key: whole or layer by layer, checksummed, evicting for space.

    Attributes:
        checksum_failures: records that failed their checksum (and were deleted) since opening.
        evictions: documents evicted for space since opening.
    """

    checksum_failures: int = 0
    evictions: int = 0

    @abstractmethod
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
        """

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
            store.codec.CorruptRecordError: a layer failed its checksum (the record is deleted).
        """

    @abstractmethod
    def get_ids(self, key: str) -> torch.Tensor | None:
        """``[tokens]`` int64 token ids of ``key`` (checksummed), or None when absent.

        Raises:
            store.codec.CorruptRecordError: the ids failed their checksum (the record is deleted).
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

    @abstractmethod
    def ping(self) -> None:
        """Raise if the store cannot be read (readiness check)."""

    @abstractmethod
    def close(self) -> None:
        """Flush buffered state and release what this handle holds."""

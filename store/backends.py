"""Open a store backend by URL: the blob store (:func:`open_blob_store`) and the document index
(:func:`open_index`).

The only module that names the backends; the interfaces (:mod:`store.blobs.blob_store`, :mod:`store.index.document_index`)
import none of them, so adding a backend touches this module and the new one only. Backends are
imported when their scheme is asked for (a Redis client is not imported for an embedded index).
"""

from __future__ import annotations

from typing import Any

from store.blobs.blob_store import BlobStore
from store.index.document_index import DocumentIndex

def _scheme(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def open_blob_store(url: str, **kwargs: Any) -> BlobStore:
    """Open the blob store named by ``url``.

    Args:
        url: ``lmdb://PATH`` (an LMDB environment in the folder PATH, created if needed), a Redis server
            ``redis://host:port/db`` (also ``rediss://``, ``unix://``) or a Redis Cluster
            ``redis+cluster://host:port[,host:port]`` (see :mod:`store.redis_conn`; ``?prefix=``,
            ``chunk_bytes=``, ``batch_bytes=``, ``pending_ttl_s=``).
        kwargs: passed to the backend (LMDB: ``max_map_size=``, ``map_size=``, ``on_corrupt=``,
            ``on_evict=``, ``clock=``, ``stats_flush_s=``; see :class:`store.blobs.lmdb.LmdbBlobStore`;
            Redis: see :class:`store.blobs.redis.RedisBlobStore`).
    Raises:
        ValueError: unknown scheme or no path (the message names the supported schemes).
    """
    from store.redis_conn import is_redis_url

    scheme = _scheme(url)
    if scheme == "lmdb" and url[len("lmdb://"):]:
        from store.blobs.lmdb import LmdbBlobStore

        return LmdbBlobStore(url[len("lmdb://"):], **kwargs)
    if is_redis_url(url):
        from store.blobs.redis import RedisBlobStore

        return RedisBlobStore.from_url(url, **kwargs)
    raise ValueError(f"unknown blob store URL {url!r}; supported: lmdb://PATH, redis://host:port/db, "
                     "redis+cluster://host:port[,host:port]")


def open_index(url: str, env=None, **kwargs: Any) -> DocumentIndex:
    """Open the index named by ``url``.

    Args:
        url: ``lmdb://PATH`` (embedded, in the store's LMDB environment) or ``redis://host:port/db``
            (also ``rediss://``, ``unix://``; ``?prefix=...`` sets the key prefix).
        env: an open :class:`store.lmdb_env.LmdbEnv` to share (embedded only; else opened from PATH).
        kwargs: passed to the backend (``prefix=`` for Redis, ``clock=`` for both).

    Raises:
        ValueError: unknown scheme.
    """
    scheme = _scheme(url)
    if scheme == "lmdb":
        from store.index.embedded import EmbeddedIndex
        from store.lmdb_env import open_env

        return EmbeddedIndex(env if env is not None else open_env(url[len("lmdb://") :]), **kwargs)
    if scheme in ("redis", "rediss", "unix"):
        from store.index.redis import RedisIndex

        return RedisIndex.from_url(url, **kwargs)
    raise ValueError(f"unknown index URL {url!r}; use lmdb://PATH or redis://host:port/db")

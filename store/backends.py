"""The one backend registry: what each URL scheme opens, for each kind of stored thing (blobs, the
document index, texts, this host's local store).

:data:`BACKENDS` maps a URL scheme to a :class:`Backend` (one opener per kind, None where the scheme
does not hold that kind); :func:`open_blob_store`, :func:`open_index`, :func:`open_texts` and
:func:`open_local_store` (``KVLINK_RAG_LOCAL_STORE_URL``, default ``lmdb://<store_dir>``) look the
scheme up there. This is the only module that names the backends: the interfaces
(:mod:`store.blobs.blob_store`, :mod:`store.index.document_index`, :mod:`store.texts`) import none of them,
and :mod:`store.factory` opens everything through here, so adding a backend is one module and one entry
in :data:`BACKENDS`. Backends are imported when their scheme is asked for (a Redis client is not imported
for an embedded index).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from store.blobs.blob_store import BlobStore
    from store.index.document_index import DocumentIndex
    from store.lmdb_env import LmdbEnv
    from store.texts import Texts


@dataclass(frozen=True)
class Backend:
    """The openers of one URL scheme: ``blobs(url, **kwargs)``, ``index(url, env, **kwargs)``,
    ``texts(url, env, mirror)`` and ``local(url, max_bytes, on_corrupt)`` (this host's bounded store, which
    also holds the texts and index unless they are elsewhere); None where the scheme does not hold that kind."""

    blobs: Callable[..., BlobStore] | None
    index: Callable[..., DocumentIndex] | None = None
    texts: Callable[..., Texts] | None = None
    local: Callable[..., BlobStore] | None = None


def _lmdb_path(url: str) -> str:
    path = url[len("lmdb://"):]
    if not path:
        raise ValueError(f"{url!r} names no folder")
    return path


def _lmdb_env(url: str, env: LmdbEnv | None) -> LmdbEnv:
    from store.lmdb_env import open_env

    return env if env is not None else open_env(_lmdb_path(url))


def _lmdb_blobs(url: str, **kwargs: Any) -> BlobStore:
    from store.blobs.lmdb import LmdbBlobStore

    return LmdbBlobStore(_lmdb_path(url), **kwargs)


def _lmdb_index(url: str, env: LmdbEnv | None = None, **kwargs: Any) -> DocumentIndex:
    from store.index.embedded import EmbeddedIndex

    return EmbeddedIndex(_lmdb_env(url, env), **kwargs)


def _lmdb_texts(url: str, env: LmdbEnv | None = None, mirror: Texts | None = None) -> Texts:
    from store.texts import TextStore

    return TextStore(_lmdb_env(url, env))


def _lmdb_local(url: str, max_bytes: int, on_corrupt: Callable[[str], None] | None = None) -> BlobStore:
    """This host's LMDB store, its map never past ``max_bytes``."""
    return _lmdb_blobs(url, max_map_size=max_bytes, on_corrupt=on_corrupt)


def _redis_blobs(url: str, **kwargs: Any) -> BlobStore:
    from store.blobs.redis import RedisBlobStore

    return RedisBlobStore.from_url(url, **kwargs)


def _redis_index(url: str, env: LmdbEnv | None = None, **kwargs: Any) -> DocumentIndex:
    from store.index.redis import RedisIndex

    return RedisIndex.from_url(url, **kwargs)


def _redis_texts(url: str, env: LmdbEnv | None = None, mirror: Texts | None = None) -> Texts:
    """Texts in Redis (every host reads them), mirrored in ``mirror`` (this host's LMDB texts: reads while
    Redis is down), which is seeded into Redis now."""
    from store.redis_texts import RedisTextStore

    texts = RedisTextStore.from_url(url, local=mirror)
    texts.seed_from_local()
    return texts


_LMDB = Backend(_lmdb_blobs, _lmdb_index, _lmdb_texts, _lmdb_local)
_REDIS = Backend(_redis_blobs, _redis_index, _redis_texts)
_REDIS_CLUSTER = Backend(_redis_blobs)  # the shared KV tier only: no index or texts on a cluster
BACKENDS: dict[str, Backend] = {
    "lmdb": _LMDB,
    "redis": _REDIS, "rediss": _REDIS, "unix": _REDIS,
    "redis+cluster": _REDIS_CLUSTER, "rediss+cluster": _REDIS_CLUSTER,
}
_SUPPORTED = {  # what a refusal names, per kind
    "blobs": "lmdb://PATH, redis://host:port/db, redis+cluster://host:port[,host:port]",
    "index": "lmdb://PATH or redis://host:port/db",
    "texts": "lmdb://PATH or redis://host:port/db",
    "local": "lmdb://PATH",
}


_KIND_NAMES = {"local": "local store"}


def _opener(url: str, kind: str) -> Callable[..., Any]:
    """The ``kind`` opener of ``url``'s scheme.

    Raises:
        ValueError: no scheme, an unknown one, or one without that kind (the message names the supported ones).
    """
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    backend = BACKENDS.get(scheme)
    opener = getattr(backend, kind) if backend is not None else None
    if opener is None:
        raise ValueError(f"unknown {_KIND_NAMES.get(kind, kind)} URL {url!r}; supported: {_SUPPORTED[kind]}")
    return opener


def _names_a_folder(url: str, what: str, kind: str) -> None:
    """Refuse an ``lmdb://`` URL without a folder, naming the supported URLs of ``kind``."""
    if url.lower().startswith("lmdb://") and not url[len("lmdb://"):]:
        raise ValueError(f"{what} URL {url!r} names no folder; supported: {_SUPPORTED[kind]}")


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
    _names_a_folder(url, "blob store", "blobs")
    return _opener(url, "blobs")(url, **kwargs)


def open_index(url: str, env: LmdbEnv | None = None, **kwargs: Any) -> DocumentIndex:
    """Open the index named by ``url``.

    Args:
        url: ``lmdb://PATH`` (embedded, in the store's LMDB environment) or ``redis://host:port/db``
            (also ``rediss://``, ``unix://``; ``?prefix=...`` sets the key prefix).
        env: an open :class:`store.lmdb_env.LmdbEnv` to share (embedded only; else the folder's
            process-wide environment).
        kwargs: passed to the backend (``prefix=`` for Redis, ``clock=`` for both).
    Raises:
        ValueError: unknown scheme.
    """
    return _opener(url, "index")(url, env, **kwargs)


def open_texts(url: str, env: LmdbEnv | None = None, mirror: Texts | None = None) -> Texts:
    """Open the document texts named by ``url`` (the index's URL: texts live beside the index).

    Args:
        url: ``lmdb://PATH`` (in the folder's LMDB environment, or ``env``) or ``redis://host:port/db``.
        mirror: Redis only: this host's local texts, which keep a copy of every text for reads while Redis
            is down (seeded into Redis when opened).
    Raises:
        ValueError: unknown scheme.
    """
    return _opener(url, "texts")(url, env, mirror)


def open_local_store(url: str, max_bytes: int, on_corrupt: Callable[[str], None] | None = None) -> BlobStore:
    """Open this host's local store named by ``url`` (:attr:`store.settings.StoreSettings.local_store`).

    Args:
        url: ``lmdb://PATH`` (an LMDB environment in the folder PATH, created if needed; the embedded index
            and the texts share it).
        max_bytes: the store's size limit (LMDB: its map never grows past it; least valuable caches are evicted).
        on_corrupt: called with a cache key whose record failed its checksum.
    Raises:
        ValueError: unknown scheme, one that cannot be the local store, or no path (the message names the
            supported ones).
    """
    _names_a_folder(url, "local store", "local")
    return _opener(url, "local")(url, max_bytes, on_corrupt)

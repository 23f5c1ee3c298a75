"""Blob backends: where documents' KV records are kept by cache key (the :class:`~store.blobs.blob_store.BlobStore`
interface; LMDB on this host, Redis or Redis Cluster shared, behind circuit breakers), opened by URL through
:mod:`store.backends`."""

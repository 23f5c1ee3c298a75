"""Background loading of LMDB documents for the linker, handed out layer by layer.

A background thread reads each LMDB-resident document whole (one verified copy per tensor, see
:meth:`store.blobs.BlobStore.get`), then queues the layers ``(k_raw, v)`` of all documents, ``depth``
layers ahead of the consumer, so the concatenation and hand-off of layer l+1 overlap the RoPE and copies
of layer l (the load/compute overlap of LMCache and CacheBlend). Whole-document reads replaced one
LMDB transaction per layer and document: on the CPU the per-layer reads cost more than the overlap won.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

import torch

from kvlink_rag.types import DocumentKV, LayeredDocuments
from store.blobs import BlobStore


def prefetch_layers(blobs: BlobStore, items: list[DocumentKV | str], depth: int = 2,
                    on_loaded: Callable[[str, DocumentKV], None] | None = None) -> LayeredDocuments:
    """Stream documents, some in memory (``DocumentKV``) and some in LMDB (cache key ``str``), by layer.

    Args:
        blobs: the blob store holding the keyed documents.
        items: documents in slot order.
        depth: layers the reader may run ahead.
        on_loaded: called with ``(key, DocumentKV)`` for each keyed document once all its layers were read
            (to fill the memory tiers).
    Returns:
        a :class:`LayeredDocuments` whose ``layers`` yield ``[kv_heads, total_tokens, head_dim]`` pairs.
    Raises:
        KeyError: a keyed document is absent (checked up front) — the consumer falls back to encoding.
        ValueError: the documents' fingerprints or layer counts differ.
        KeyError: also raised from ``layers`` when a keyed document vanished or failed its checksum
            meanwhile (the blob store deletes and reports a corrupt record); the engine then encodes.
    """
    metas: list[dict | None] = [None if isinstance(it, DocumentKV) else blobs.meta(it) for it in items]
    for it, meta in zip(items, metas):
        if not isinstance(it, DocumentKV) and meta is None:
            raise KeyError(it)
    fps = {it.fingerprint if isinstance(it, DocumentKV) else m["fingerprint"] for it, m in zip(items, metas)}
    layers = {it.num_layers if isinstance(it, DocumentKV) else m["shape"][0] for it, m in zip(items, metas)}
    if len(fps) != 1 or len(layers) != 1:
        raise ValueError("documents differ in fingerprint or layer count")
    n_layers = layers.pop()
    num_tokens = [it.num_tokens if isinstance(it, DocumentKV) else m["shape"][2] for it, m in zip(items, metas)]
    fp = fps.pop()
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def reader() -> None:
        try:
            docs: list[DocumentKV] = []
            for j, it in enumerate(items):
                kv = it if isinstance(it, DocumentKV) else blobs.get(it)
                # None: deleted meanwhile, or failed its checksum (deleted and reported by the store);
                # another length or fingerprint: replaced since the metas were read
                if kv is None or kv.num_tokens != num_tokens[j] or kv.fingerprint != fp:
                    raise KeyError(it)
                docs.append(kv)
            for i in range(n_layers):
                # item: ([kv_heads, total_tokens, head_dim] keys before RoPE, same-shaped values)
                item = (torch.cat([d.keys[i] for d in docs], dim=1), torch.cat([d.values[i] for d in docs], dim=1))
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            if on_loaded is not None:
                for it, kv in zip(items, docs):
                    if isinstance(it, str):
                        on_loaded(it, kv)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            q.put(e)

    def consume() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        try:
            for _ in range(n_layers):
                item = q.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()

    threading.Thread(target=reader, name="kv-prefetch", daemon=True).start()
    return LayeredDocuments(num_tokens, fp, consume())

"""Layer-wise prefetch: read layer l+1 of every document from LMDB while the linker rotates layer l.

A background thread reads each layer's records (page cache or disk), decodes them and queues
``(k_raw, v)`` for the consumer, ``depth`` layers ahead; so the load hides behind RoPE and copies
(the overlap LMCache and CacheBlend use between loading and compute).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

import torch

from kvlink_rag.types import DocumentKV, LayeredDocuments
from store.blob_store import BlobStore


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
        store.codec.CorruptRecordError: raised from ``layers`` when a layer fails its checksum (the record
            is deleted by the blob store).
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
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def reader() -> None:
        try:
            iters = {j: blobs.iter_layers(it) for j, it in enumerate(items) if isinstance(it, str)}
            got: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {j: [] for j in iters}
            for i in range(n_layers):
                ks, vs = [], []
                for j, it in enumerate(items):
                    if isinstance(it, DocumentKV):
                        k, v = it.keys[i], it.values[i]
                    else:
                        k, v = next(iters[j])
                        got[j].append((k, v))
                    ks.append(k)
                    vs.append(v)
                item = (torch.cat(ks, dim=1), torch.cat(vs, dim=1))
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            if on_loaded is not None:
                for j, layer_list in got.items():
                    meta = metas[j]
                    kv = DocumentKV(keys=torch.stack([k for k, _ in layer_list]),
                                    values=torch.stack([v for _, v in layer_list]),
                                    token_ids=blobs.get_ids(items[j]), fingerprint=meta["fingerprint"],
                                    encoding=meta["encoding"])
                    on_loaded(items[j], kv)
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
    return LayeredDocuments(num_tokens, fps.pop(), consume())

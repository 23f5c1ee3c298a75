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

from kvlink_rag.retention import check_retention, kept_positions
from kvlink_rag.types import DocumentKV, LayeredDocuments, RetainedKV
from store.blobs.blob_store import BlobStore
from store.records.ordered_layout import record_importance


def _describe(blobs: BlobStore, items: list[DocumentKV | RetainedKV | str]
              ) -> tuple[list[dict | None], str, int, list[int]]:
    """Meta records of the keyed documents, and the common fingerprint, layer count and (whole) token counts.

    Raises:
        KeyError: a keyed document is absent.
        ValueError: the documents' fingerprints or layer counts differ.
    """
    metas: list[dict | None] = [None if not isinstance(it, str) else blobs.meta(it) for it in items]
    for it, meta in zip(items, metas):
        if isinstance(it, str) and meta is None:
            raise KeyError(it)
    fps = {m["fingerprint"] if isinstance(it, str) else it.fingerprint for it, m in zip(items, metas)}
    layers = {m["shape"][0] if isinstance(it, str) else it.num_layers for it, m in zip(items, metas)}
    if len(fps) != 1 or len(layers) != 1:
        raise ValueError("documents differ in fingerprint or layer count")
    num_tokens = [m["shape"][2] if isinstance(it, str) else it.doc_tokens if isinstance(it, RetainedKV)
                  else it.num_tokens for it, m in zip(items, metas)]
    return metas, fps.pop(), layers.pop(), num_tokens


class _LayerReader:
    """The background side: reads layer i of every keyed document, concatenates it with the in-memory
    documents' layer i and queues ``(k_raw, v)``, each ``[kv_heads, total_tokens, head_dim]``.

    With ``positions`` (retention below 1) only those tokens of each document are streamed: keyed documents
    through ``iters`` made up front (prefix reads), in-memory ones gathered; no document is handed to
    ``on_loaded`` then (a part of a document is not a cache entry), but each keyed part is handed to
    ``on_retained`` (a tier that holds documents at a retention at most ``retention`` can keep it)."""

    def __init__(self, blobs: BlobStore, items: list[DocumentKV | str], metas: list[dict | None], n_layers: int,
                 depth: int, on_loaded: Callable[[str, DocumentKV], None] | None,
                 positions: list[torch.Tensor] | None = None, iters: dict[int, Iterator] | None = None,
                 on_retained: Callable[[str, RetainedKV, dict], None] | None = None, retention: float = 1.0):
        self.blobs, self.items, self.metas, self.n_layers, self.on_loaded = blobs, items, metas, n_layers, on_loaded
        self.positions, self.iters = positions, iters
        self.on_retained, self.retention = on_retained, retention
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()

    def _memory_layer(self, j: int, kv: DocumentKV | RetainedKV, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.positions is None or isinstance(kv, RetainedKV):  # a retained part is streamed as it is
            return kv.keys[i], kv.values[i]
        pos = self.positions[j].to(kv.keys.device)
        return kv.keys[i][:, pos], kv.values[i][:, pos]

    def run(self) -> None:
        try:
            iters = self.iters if self.iters is not None else {
                j: self.blobs.iter_layers(it) for j, it in enumerate(self.items) if isinstance(it, str)}
            got: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {
                j: [] for j in iters} if self.positions is None or self.on_retained is not None else {}
            for i in range(self.n_layers):
                ks, vs = [], []
                for j, it in enumerate(self.items):
                    k, v = next(iters[j]) if isinstance(it, str) else self._memory_layer(j, it, i)
                    if j in got:
                        got[j].append((k, v))
                    ks.append(k)
                    vs.append(v)
                if not self._hand_over((torch.cat(ks, dim=1), torch.cat(vs, dim=1))):
                    return  # the consumer stopped early
            for j, layer_list in got.items():
                if self.positions is None and self.on_loaded is not None:
                    self.on_loaded(self.items[j], self._whole(j, layer_list))
                elif self.positions is not None:
                    self.on_retained(self.items[j], self._part(j, layer_list), self.metas[j])
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            self.queue.put(e)

    def _hand_over(self, item) -> bool:
        """Queue ``item`` unless the consumer has stopped; False when it has."""
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _whole(self, j: int, layer_list: list[tuple[torch.Tensor, torch.Tensor]]) -> DocumentKV:
        """Keyed document ``j`` reassembled from the layers read (for the memory tiers)."""
        meta = self.metas[j]
        return DocumentKV(keys=torch.stack([k for k, _ in layer_list]), values=torch.stack([v for _, v in layer_list]),
                          token_ids=self.blobs.get_ids(self.items[j]), fingerprint=meta["fingerprint"],
                          encoding=meta["encoding"], importance=record_importance(meta))

    def _part(self, j: int, layer_list: list[tuple[torch.Tensor, torch.Tensor]]) -> RetainedKV:
        """Keyed document ``j``'s retained tokens as read (``[layers, kv_heads, kept, head_dim]``)."""
        meta = self.metas[j]
        return RetainedKV(torch.stack([k for k, _ in layer_list]), torch.stack([v for _, v in layer_list]),
                          self.positions[j], meta["shape"][2], meta["fingerprint"], meta["encoding"], self.retention)

    def consume(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The consumer side: the layers in order; closing it early stops the reader."""
        try:
            for _ in range(self.n_layers):
                item = self.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.stop.set()


def _retained(blobs: BlobStore, items: list[DocumentKV | str], metas: list[dict | None], retention: float,
              method: str) -> tuple[list[torch.Tensor], dict[int, Iterator]]:
    """Per document the sorted offsets kept at ``retention``, and the layer iterators of the keyed ones
    (prefix reads of importance-ordered records for ``importance``; gathered whole layers otherwise)."""
    positions: list[torch.Tensor] = []
    iters: dict[int, Iterator] = {}
    for j, (it, meta) in enumerate(zip(items, metas)):
        if isinstance(it, RetainedKV):  # a memory tier's part, already the tokens kept at retention
            it.check(retention, method)
            positions.append(it.positions)
        elif isinstance(it, DocumentKV):
            positions.append(kept_positions(it.importance, it.num_tokens, retention, method))
        elif method == "importance":
            pos, iters[j] = blobs.iter_retained_layers(it, retention)
            positions.append(pos)
        else:
            pos = kept_positions(None, meta["shape"][2], retention, method)
            iters[j] = ((k[:, pos], v[:, pos]) for k, v in blobs.iter_layers(it))
            positions.append(pos)
    return positions, iters


def prefetch_layers(blobs: BlobStore, items: list[DocumentKV | RetainedKV | str], depth: int = 2,
                    on_loaded: Callable[[str, DocumentKV], None] | None = None, retention: float = 1.0,
                    method: str = "importance",
                    on_retained: Callable[[str, RetainedKV, dict], None] | None = None) -> LayeredDocuments:
    """Stream documents, some in memory (``DocumentKV``) and some in LMDB (cache key ``str``), by layer.

    Args:
        blobs: the blob store holding the keyed documents.
        items: documents in slot order (in memory: whole, or below retention 1 a tier's :class:`RetainedKV`).
        depth: layers the reader may run ahead.
        on_loaded: called with ``(key, DocumentKV)`` for each keyed document once all its layers were read
            (to fill the memory tiers; not for a retention below 1).
        retention, method: fraction of each document's tokens streamed and which (``kvlink_rag.retention``);
            below 1, keyed importance-ordered documents are read as a prefix of each layer record.
        on_retained: below retention 1 with method ``importance``, called with ``(key, RetainedKV, meta)`` for
            each keyed document once all its layers were read (to fill tiers that hold documents at a lower
            retention).
    Returns:
        a :class:`LayeredDocuments` whose ``layers`` yield ``[kv_heads, total_tokens, head_dim]`` pairs.
    Raises:
        KeyError: a keyed document is absent (checked up front) — the consumer falls back to encoding.
        ValueError: the documents' fingerprints or layer counts differ.
        store.records.codec.CorruptRecordError: raised from ``layers`` when a layer fails its checksum (the record
            is deleted by the blob store).
    """
    metas, fingerprint, n_layers, num_tokens = _describe(blobs, items)
    if check_retention(retention) == 1.0:
        if any(isinstance(it, RetainedKV) for it in items):
            raise ValueError("a partly retained document cannot be streamed at retention 1")
        reader = _LayerReader(blobs, items, metas, n_layers, depth, on_loaded)
        threading.Thread(target=reader.run, name="kv-prefetch", daemon=True).start()
        return LayeredDocuments(num_tokens, fingerprint, reader.consume())
    positions, iters = _retained(blobs, items, metas, retention, method)
    reader = _LayerReader(blobs, items, metas, n_layers, depth, None, positions, iters,
                          on_retained if method == "importance" else None, retention)
    threading.Thread(target=reader.run, name="kv-prefetch", daemon=True).start()
    return LayeredDocuments([int(p.numel()) for p in positions], fingerprint, reader.consume(), positions=positions,
                            doc_lengths=num_tokens)

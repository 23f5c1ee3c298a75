"""Layer-wise prefetch: read layer l+1 of every document from LMDB while the linker rotates layer l.

A background thread reads each layer's records (page cache or disk), decodes them and queues
``(k_raw, v)`` for the consumer, ``depth`` layers ahead; so the load hides behind RoPE and copies
(the overlap LMCache and CacheBlend use between loading and compute).
"""

from __future__ import annotations

import functools
import itertools
import threading
from contextlib import AbstractContextManager, nullcontext
from collections.abc import Callable, Iterator

import torch

from kvlink_rag.retention import check_retention
from kvlink_rag.rows import RowWriter, StoredRows, stage_tensors
from kvlink_rag.types import DocumentKV, LayeredDocuments, RetainedKV
from store.blobs.blob_store import BlobStore, DecodedLayer
from store.records.ordered_layout import record_importance
from store.records.codec import target_dtype
from store.records.one_thread import write_into
from store.tiers.reader_depth import reader_depth
from kvlink_rag.omp_pool import serial_thread
from store.tiers.layer_queue import Reader
from store.tiers.retained_reader import RetainedReader, retained_streams
from store.tiers.tier_fill import TIER_FILLER


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



class _StoredReader(Reader):
    """Retention 1: layer ``i`` of every document decoded straight into the consumer's buffers
    ``[kv_heads, total_tokens, head_dim]`` (:meth:`fill`: a request's KV blocks) or one joined buffer pair per
    layer (:meth:`run`, :meth:`inline`): keyed records in their stored token order (their offsets are carried as
    data, :attr:`LayeredDocuments.positions`: no gather back to position order on the query path), in-memory
    documents in position order. After the last layer a thread fills the memory tiers (``on_loaded``) with the
    keyed documents read again in position order, by the process's low-priority :data:`TIER_FILLER`, so the
    query's own forward keeps the cores."""

    def __init__(self, items: list[DocumentKV | str], metas: list[dict | None], n_layers: int, depth: int,
                 on_loaded: Callable[[str, DocumentKV], None] | None, opened: dict[int, tuple],
                 get: Callable[[str], DocumentKV | None], get_ids: Callable[[str], torch.Tensor | None],
                 session: Callable[[], AbstractContextManager[None]] = nullcontext):
        super().__init__(n_layers, depth)
        self.session = session
        self.items, self.metas, self.on_loaded, self.opened, self.get = items, metas, on_loaded, opened, get
        self.get_ids = get_ids
        self.lengths = [m["shape"][2] if m is not None else it.num_tokens for it, m in zip(items, metas)]
        self.bounds = [0, *itertools.accumulate(self.lengths)]
        dtypes = [target_dtype(m, None) if m is not None else it.keys.dtype for it, m in zip(items, metas)]
        self.dtype = functools.reduce(torch.promote_types, dtypes)
        m = next((m for m in metas if m is not None), None)
        self.heads, self.head_dim = (m["shape"][1], m["shape"][3]) if m is not None else (
            items[0].keys.shape[1], items[0].keys.shape[3])
        self.fills = {j: iter(f) for j, (_, f) in opened.items()}
        self.decoded: dict[int, list[DecodedLayer]] = {}

    def fill(self, i: int, k_out: torch.Tensor, v_out: torch.Tensor, keys: RowWriter | None = None,
             values: RowWriter | None = None) -> None:
        """Layer ``i`` of every document into ``k_out``/``v_out`` ``[kv_heads, total_tokens, head_dim]`` (views
        with contiguous rows, any float dtype), through the writers when given (:attr:`LayeredDocuments.fill`), in
        order from layer 0, on the calling thread; the last layer starts the memory-tier fill. With writers, every
        document stored in the outputs' dtype (or in bfloat16, for float32 outputs: widened by the writer) is
        handed over as its rows and written in one call per writer (:meth:`~kvlink_rag.rows.RowWriter.write_many`),
        the others one by one."""
        staged = keys is not None and values is not None
        k_parts: list[StoredRows] = []
        v_parts: list[StoredRows] = []
        with self.session():  # every keyed document's layer in one read of the store
            for j, it in enumerate(self.items):
                a, b = self.bounds[j], self.bounds[j + 1]
                shape = (k_out.shape[0], b - a, k_out.shape[2])
                if j in self.fills:
                    f = next(self.fills[j])
                    if not (staged and f.stage(k_out.dtype, shape, a, k_parts, v_parts)):
                        f(k_out[:, a:b], v_out[:, a:b], keys, values, a)
                    if isinstance(f, DecodedLayer) and self.on_loaded is not None:
                        self.decoded.setdefault(j, []).append(f)  # already in memory: the tiers take it as it is
                elif not (staged and stage_tensors(it.keys[i], it.values[i], k_out.dtype, shape, a, k_parts, v_parts)):
                    write_into(k_out[:, a:b], it.keys[i], keys, a)
                    write_into(v_out[:, a:b], it.values[i], values, a)
            if k_parts:  # inside the session: the staged rows are pages of its read
                keys.write_many(k_out, k_parts)
                values.write_many(v_out, v_parts)
        if i == self.n_layers - 1:
            self._finish()

    def _layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = torch.empty(self.heads, self.bounds[-1], self.head_dim, dtype=self.dtype)
        v = torch.empty_like(k)  # k, v: [kv_heads, total_tokens, head_dim], documents in slot order
        self.fill(i, k, v)
        return k, v

    def _finish(self) -> None:
        """Past the last layer: the memory tiers get the keyed documents, read again in position order (a read
        counts the record's access) or, where the backend streamed them decoded, as streamed (no second fetch
        from a shared tier); without tiers to fill, the streams count the access."""
        if self.on_loaded is None:
            for f in self.fills.values():
                next(f, None)
            return
        for j in self.fills:
            layers = self.decoded.get(j)
            get = self.get if layers is None else functools.partial(self._whole, j, layers)
            TIER_FILLER.submit(self.items[j], get, self.on_loaded)

    def _whole(self, j: int, layers: list[DecodedLayer], key: str) -> DocumentKV:
        """Keyed document ``j`` from the layers a backend streamed decoded (no second read of its record)."""
        meta = self.metas[j]
        return DocumentKV(keys=torch.stack([f.k for f in layers]), values=torch.stack([f.v for f in layers]),
                          token_ids=self.get_ids(key), fingerprint=meta["fingerprint"], encoding=meta["encoding"],
                          importance=record_importance(meta))

    def run(self) -> None:
        """The background reader: layers decoded ``depth`` ahead of the consumer."""
        serial_thread()  # beside the consumer's forward: no OpenMP team of its own (kvlink_rag.omp_pool)
        try:
            for i in range(self.n_layers):
                if not self._hand_over(self._layer(i)):
                    return  # the consumer stopped early
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            self.queue.put(e)

    def inline(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The layers decoded on the consumer's own thread as it asks for them (no thread beside its torch work)."""
        for i in range(self.n_layers):
            yield self._layer(i)

    def positions(self) -> list[torch.Tensor] | None:
        """Per document the offsets of its streamed rows (None when every document streams in position order)."""
        orders = [self.opened[j][0] if j in self.opened else None for j in range(len(self.items))]
        if all(o is None for o in orders):
            return None
        return [torch.arange(n) if o is None else o for o, n in zip(orders, self.lengths)]


def prefetch_layers(blobs: BlobStore, items: list[DocumentKV | RetainedKV | str], depth: int | None = None,
                    on_loaded: Callable[[str, DocumentKV], None] | None = None, retention: float = 1.0,
                    method: str = "importance",
                    on_retained: Callable[[str, RetainedKV, dict], None] | None = None) -> LayeredDocuments:
    """Stream documents, some in memory (``DocumentKV``) and some in LMDB (cache key ``str``), by layer.

    Args:
        blobs: the blob store holding the keyed documents.
        items: documents in slot order (in memory: whole, or below retention 1 a tier's :class:`RetainedKV`).
        depth: layers a background reader may run ahead; 0 reads each layer on the consumer's thread as it is
            asked for (retention 1; below 1 a reader always runs); None: :func:`reader_depth`.
        on_loaded: called with ``(key, DocumentKV)`` for each keyed document once all its layers were read
            (to fill the memory tiers; not for a retention below 1).
        retention, method: fraction of each document's tokens streamed and which (``kvlink_rag.retention``);
            below 1, keyed importance-ordered documents are read as a prefix of each layer record.
        on_retained: below retention 1 with method ``importance``, called with ``(key, RetainedKV, meta)`` for
            each keyed document once all its layers were read (to fill tiers that hold documents at a lower
            retention).
    Returns:
        a :class:`LayeredDocuments` whose ``layers`` yield ``[kv_heads, total_tokens, head_dim]`` pairs; at retention
        1 an importance-ordered record streams its rows as stored, its ``positions`` carrying their offsets (the
        consumers rotate and mask by position, so the order of a document's keys is free).
    Raises:
        KeyError: a keyed document is absent (checked up front) — the consumer falls back to encoding.
        ValueError: the documents' fingerprints or layer counts differ.
        store.records.codec.CorruptRecordError: raised from ``layers`` when a layer fails its checksum (the record
            is deleted by the blob store).
    """
    metas, fingerprint, n_layers, num_tokens = _describe(blobs, items)
    depth = reader_depth() if depth is None else depth
    if check_retention(retention) == 1.0:
        if any(isinstance(it, RetainedKV) for it in items):
            raise ValueError("a partly retained document cannot be streamed at retention 1")
        opened = {j: blobs.iter_stored_layers(it) for j, it in enumerate(items) if isinstance(it, str)}
        stored = _StoredReader(items, metas, n_layers, depth, on_loaded, opened, blobs.get, blobs.get_ids,
                               blobs.layer_session)
        if depth > 0:
            threading.Thread(target=stored.run, name="kv-prefetch", daemon=True).start()
        positions = stored.positions()
        return LayeredDocuments(num_tokens, fingerprint, stored.consume() if depth > 0 else stored.inline(),
                                positions=positions, fill=None if depth > 0 else stored.fill,
                                doc_lengths=None if positions is None else num_tokens)
    positions, iters = retained_streams(blobs, items, metas, retention, method)
    reader = RetainedReader(items, metas, n_layers, max(1, depth), positions, iters,
                          on_retained if method == "importance" else None, retention)
    threading.Thread(target=reader.run, name="kv-prefetch", daemon=True).start()
    return LayeredDocuments([int(p.numel()) for p in positions], fingerprint, reader.consume(), positions=positions,
                            doc_lengths=num_tokens)

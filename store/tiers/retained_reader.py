"""Streaming documents below retention 1: each layer of every document's kept tokens read by a background thread
(keyed importance-ordered records as a prefix of each layer record), concatenated and queued for the consumer
(:func:`store.tiers.prefetch.prefetch_layers`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from kvlink_rag.omp_pool import serial_thread
from kvlink_rag.retention import kept_positions
from kvlink_rag.types import DocumentKV, RetainedKV
from store.blobs.blob_store import BlobStore
from store.tiers.layer_queue import Reader


class RetainedReader(Reader):
    """Retention below 1: reads layer i of every document's kept tokens (keyed documents through ``iters`` made
    up front, prefix reads; in-memory ones gathered at ``positions``), concatenates them and queues
    ``(k_raw, v)``, each ``[kv_heads, total_kept, head_dim]``; each keyed part is handed to ``on_retained`` once
    read (a tier that holds documents at a retention at most ``retention`` can keep it)."""

    def __init__(self, items: list[DocumentKV | RetainedKV | str], metas: list[dict | None], n_layers: int,
                 depth: int, positions: list[torch.Tensor], iters: dict[int, Iterator],
                 on_retained: Callable[[str, RetainedKV, dict], None] | None, retention: float):
        super().__init__(n_layers, depth)
        self.items, self.metas, self.positions, self.iters = items, metas, positions, iters
        self.on_retained, self.retention = on_retained, retention

    def _memory_layer(self, j: int, kv: DocumentKV | RetainedKV, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(kv, RetainedKV):  # a retained part is streamed as it is
            return kv.keys[i], kv.values[i]
        pos = self.positions[j].to(kv.keys.device)
        return kv.keys[i][:, pos], kv.values[i][:, pos]

    def run(self) -> None:
        serial_thread()  # beside the consumer's forward: no OpenMP team of its own (kvlink_rag.omp_pool)
        try:
            got: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {
                j: [] for j in self.iters} if self.on_retained is not None else {}
            for i in range(self.n_layers):
                ks, vs = [], []
                for j, it in enumerate(self.items):
                    k, v = next(self.iters[j]) if isinstance(it, str) else self._memory_layer(j, it, i)
                    if j in got:
                        got[j].append((k, v))
                    ks.append(k)
                    vs.append(v)
                if not self._hand_over((torch.cat(ks, dim=1), torch.cat(vs, dim=1))):
                    return  # the consumer stopped early
            for j, layer_list in got.items():
                self.on_retained(self.items[j], self._part(j, layer_list), self.metas[j])
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            self.queue.put(e)

    def _part(self, j: int, layer_list: list[tuple[torch.Tensor, torch.Tensor]]) -> RetainedKV:
        """Keyed document ``j``'s retained tokens as read (``[layers, kv_heads, kept, head_dim]``)."""
        meta = self.metas[j]
        return RetainedKV(torch.stack([k for k, _ in layer_list]), torch.stack([v for _, v in layer_list]),
                          self.positions[j], meta["shape"][2], meta["fingerprint"], meta["encoding"], self.retention)


def retained_streams(blobs: BlobStore, items: list[DocumentKV | str], metas: list[dict | None], retention: float,
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

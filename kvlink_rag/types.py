"""Boundary dataclasses between the core, the store and the service.

Shapes follow the convention ``[layers, kv_heads, tokens, head_dim]`` for KV tensors. Importing this
module does not import torch (the CLI reads documents before it loads the model); the functions that
need torch import it when called.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .rows import RowWriter, StoredRows, stage_tensors, write_rows

if TYPE_CHECKING:
    import torch
    from transformers import DynamicCache

DTYPE_NAMES = ("float32", "bfloat16", "float16")


def kv_dtypes() -> dict[str, torch.dtype]:
    """``{name: torch dtype}`` of the supported KV/compute dtypes (:data:`DTYPE_NAMES`)."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Document:
    """A document as given by a user: text and optional title.

    ``chunk`` is the index of this piece within a longer document split by :mod:`kvlink_rag.text.chunking`
    (None: a whole document); it never enters the cache key. ``context`` is the text of the chunk(s) before
    this one when chunks are encoded in context (``chunk_context`` chunks back): the chunk's KV is computed right
    after that text, and its cache key holds both texts. None: the chunk (or document) is encoded and keyed alone.
    ``previous`` is the chunk before this one as the chunker made it (None for a whole document or a first chunk):
    what a chunk encoded after its earlier chunks' caches reads (``KVLINK_RAG_CHUNK_CONTEXT_FROM=cache``); never in
    equality, hash or key.
    """

    text: str
    title: str | None = None
    chunk: int | None = None
    context: str | None = None
    previous: Document | None = field(default=None, compare=False, repr=False)


class ContextTooLong(ValueError):
    """The prompt (prefix, documents, link tokens, question) plus the requested new tokens does not fit.

    Raised by the prompt/engine length checks when a request cannot fit the model's context window
    (``max_position_embeddings``) or a configured token limit. The message says which limit and by how
    much. The service maps exactly this exception (not any ``ValueError``) to HTTP 422
    ``context_too_long``; a plain ``ValueError`` from inside the model is an internal error.
    """


def parse_dtype(name: str) -> torch.dtype:
    """Map ``'float32' | 'bfloat16' | 'float16'`` to a torch dtype.

    Raises:
        ValueError: for any other name.
    """
    try:
        return kv_dtypes()[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPE_NAMES)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    """Inverse of :func:`parse_dtype`."""
    for name, d in kv_dtypes().items():
        if d == dtype:
            return name
    raise ValueError(f"unsupported dtype {dtype}")


@dataclass(frozen=True)
class DocumentKV:
    """Position-free KV cache of one document, as precomputed by ``encode_document``.

    Attributes:
        keys: ``[layers, kv_heads, tokens, head_dim]`` keys *before* RoPE (after k_proj and any k_norm).
        values: ``[layers, kv_heads, tokens, head_dim]`` values, same dtype as ``keys``.
        token_ids: ``[tokens]`` int64 ids of the document text tokenised alone.
        fingerprint: encoding fingerprint (model identity, encoding context, KV dtype); a cache is only
            valid for an engine with the same fingerprint.
        encoding: ``'isolated'`` or ``'anchored'``.
        importance: ``[tokens]`` float32 H2O importance of each token (attention received from later tokens
            at precompute, see :mod:`kvlink_rag.retention`), or None (a cache made without scores: retention
            keeps tokens in positional order).
    """

    keys: torch.Tensor
    values: torch.Tensor
    token_ids: torch.Tensor
    fingerprint: str
    encoding: str
    importance: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        """Document length in tokens."""
        return int(self.keys.shape[2])

    @property
    def num_layers(self) -> int:
        return int(self.keys.shape[0])

    @property
    def dtype(self) -> torch.dtype:
        return self.keys.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of K and V together."""
        return self.keys.numel() * self.keys.element_size() * 2


@dataclass(frozen=True)
class RetainedKV:
    """Part of a document's KV: the tokens a retention below 1 keeps, at their offsets within the document.

    A memory tier that holds a document at a lower retention (``store.tiers.tier_format``) serves a request at
    retention ``r`` as this: exactly the tokens ``kept_positions(importance, doc_tokens, r)`` keeps, never fewer.

    Attributes:
        keys, values: ``[layers, kv_heads, kept, head_dim]`` (keys before RoPE), tokens sorted by position.
        positions: ``[kept]`` int64 sorted offsets within the document.
        doc_tokens: the whole document's length (the positions its slot spans in the layout).
        fingerprint, encoding: as :class:`DocumentKV`.
        retention: the retention these tokens are the top of (method ``importance``).
    """

    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    doc_tokens: int
    fingerprint: str
    encoding: str
    retention: float

    @property
    def num_layers(self) -> int:
        return int(self.keys.shape[0])

    def check(self, retention: float, method: str) -> None:
        """Raises ValueError unless these are exactly the tokens a request at ``retention`` with ``method``
        keeps (so a partly held document is never served with fewer tokens than asked)."""
        from .retention import kept_count

        if method != "importance" or int(self.positions.numel()) != kept_count(self.doc_tokens, retention):
            raise ValueError(f"{self.positions.numel()} of {self.doc_tokens} tokens held at retention "
                             f"{self.retention} cannot serve retention {retention} ({method})")


@dataclass
class LayeredDocuments:
    """Several documents' KV arriving layer by layer (prefetched from the store while layers are linked).

    Attributes:
        num_tokens: tokens of each document, in slot order.
        fingerprint: the common encoding fingerprint.
        layers: iterator over layers of ``(k_raw, v)``, each ``[kv_heads, sum(num_tokens), head_dim]``,
            documents concatenated in slot order; keys before RoPE.
        wait_s: seconds the consumer spent blocked waiting for layers (load time not hidden by compute).
        positions: per document, ``[num_tokens[j]]`` int64 offsets within the document of the tokens streamed,
            in stream order (retention below 1 keeps a subset, sorted; a store streaming an importance-ordered
            record as stored carries its order here instead of gathering it back); None: every token, offsets
            ``0..n-1``. Consumers rotate and mask by these positions, so the order of a document's keys is free.
        doc_lengths: per document, its full length in tokens (the positions its slot spans in the layout);
            None: ``num_tokens``.
        fill: where the source can write straight into the consumer's buffers: ``fill(i, k_out, v_out, keys=None,
            values=None)`` writes layer ``i`` into ``[kv_heads, sum(num_tokens), head_dim]`` views with contiguous
            rows, any float dtype, CPU: every document's keys through the :class:`RowWriter` ``keys`` and values
            through ``values`` (None: keys before RoPE and values copied as stored). A consumer calls it for every
            layer in order instead of iterating ``layers`` (never both); None: iterate ``layers``.
    """

    num_tokens: list[int]
    fingerprint: str
    layers: Iterator[tuple[torch.Tensor, torch.Tensor]]
    wait_s: float = 0.0
    positions: list[torch.Tensor] | None = None
    doc_lengths: list[int] | None = None
    fill: Callable[..., None] | None = None

    @property
    def layout_lengths(self) -> list[int]:
        """Positions each document's slot spans (its full length, kept tokens or not)."""
        return self.doc_lengths if self.doc_lengths is not None else self.num_tokens

    def offsets(self, j: int) -> torch.Tensor:
        """``[num_tokens[j]]`` int64 offsets within document ``j`` of its streamed tokens."""
        import torch

        return self.positions[j] if self.positions is not None else torch.arange(self.num_tokens[j])

    @classmethod
    def from_documents(cls, docs: list[DocumentKV | RetainedKV], retention: float = 1.0, method: str = "importance",
                       seed: int = 0) -> "LayeredDocuments":
        """In-memory documents as a layer stream (no copy beyond the per-layer concatenation).

        Args:
            docs: whole documents, or (retention below 1) parts already retained at ``retention`` by a memory
                tier (:class:`RetainedKV`, streamed as they are).
            retention: fraction of each document's tokens kept (``kvlink_rag.retention.kept_positions``);
                1 streams every token exactly as stored.
            method, seed: the retention method (``importance``, ``random``, ``recency``) and random seed.
        Raises:
            ValueError: fingerprints differ, retention outside (0, 1], or a :class:`RetainedKV` that does not hold
                exactly the tokens ``retention`` keeps.
        """
        import torch

        from .retention import check_retention, kept_positions

        if len({d.fingerprint for d in docs}) > 1:
            raise ValueError("documents were encoded with different fingerprints (model, encoding or dtype)")
        # documents may sit on different devices (read from the store on the host, encoded just now on the
        # accelerator): each layer is joined on the accelerator if any document is there
        dev = next((d.keys.device for d in docs if d.keys.device.type != "cpu"), docs[0].keys.device)
        if check_retention(retention) == 1.0:
            if any(isinstance(d, RetainedKV) for d in docs):
                raise ValueError("a partly retained document cannot be streamed at retention 1")
            layers = ((torch.cat([d.keys[i].to(dev) for d in docs], dim=1),
                       torch.cat([d.values[i].to(dev) for d in docs], dim=1)) for i in range(docs[0].num_layers))
            return cls([d.num_tokens for d in docs], docs[0].fingerprint, layers,
                       fill=_memory_fill(docs) if dev.type == "cpu" and not any(
                           d.keys.requires_grad or d.values.requires_grad for d in docs) else None)
        for d in docs:
            if isinstance(d, RetainedKV):
                d.check(retention, method)
        pos = [d.positions if isinstance(d, RetainedKV) else kept_positions(d.importance, d.num_tokens, retention,
                                                                            method, seed) for d in docs]

        def part(d, x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:  # x: [kv_heads, tokens, head_dim]
            return (x if isinstance(d, RetainedKV) else x[:, p.to(x.device)]).to(dev)

        # each layer: [kv_heads, sum(kept), head_dim], the kept tokens of every document in slot order
        layers = ((torch.cat([part(d, d.keys[i], p) for d, p in zip(docs, pos)], dim=1),
                   torch.cat([part(d, d.values[i], p) for d, p in zip(docs, pos)], dim=1))
                  for i in range(docs[0].num_layers))
        return cls([int(p.numel()) for p in pos], docs[0].fingerprint, layers, positions=pos,
                   doc_lengths=[d.doc_tokens if isinstance(d, RetainedKV) else d.num_tokens for d in docs])


def _memory_fill(docs: list[DocumentKV]) -> Callable[..., None]:
    """:attr:`LayeredDocuments.fill` over in-memory CPU documents: each document's layer written into its slice
    of the consumer's buffers (no per-layer concatenation); with writers, every document of the consumer's dtype
    (or bfloat16 into float32 buffers, widened by the writer) in one :meth:`RowWriter.write_many` call per layer."""
    import itertools

    bounds = [0, *itertools.accumulate(d.num_tokens for d in docs)]

    def fill(i: int, k_out: torch.Tensor, v_out: torch.Tensor, keys: RowWriter | None = None,
             values: RowWriter | None = None) -> None:
        staged = keys is not None and values is not None
        k_parts: list[StoredRows] = []
        v_parts: list[StoredRows] = []
        for d, a, b in zip(docs, bounds, bounds[1:]):
            shape = (k_out.shape[0], b - a, k_out.shape[2])
            if not (staged and stage_tensors(d.keys[i], d.values[i], k_out.dtype, shape, a, k_parts, v_parts)):
                write_rows(k_out[:, a:b], d.keys[i], keys, a)  # another dtype pair or layout: converted on its own
                write_rows(v_out[:, a:b], d.values[i], values, a)
        if k_parts:  # every document in one call per writer
            keys.write_many(k_out, k_parts)
            values.write_many(v_out, v_parts)

    return fill

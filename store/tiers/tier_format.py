"""Tier policy: the retention and dtype at which a memory tier holds documents.

Every :class:`store.tiers.tier.CacheTier` has a :class:`TierFormat`. The default (retention 1, native dtype) is
lossless: the tier holds the :class:`~kvlink_rag.types.DocumentKV` itself, exactly as before tier policies
existed. A *lossy* format (``retention < 1`` and/or ``int8``, e.g. the ``cold`` tier of
:func:`store.factory.memory_tiers`) holds a :class:`HeldKV` instead:

- the document's top-``r_t`` tokens in the stored importance order
  (:func:`kvlink_rag.retention.kept_positions`, method ``importance``; the order the LMDB records are laid
  out in, so the held tokens are exactly what a prefix read at ``r_t`` returns), at their positions;
- optionally int8 as the LMDB store quantises (:mod:`store.records.quant`): keys per channel (over the held tokens),
  values per token, float16 scales and zeros.

Lookup (:meth:`HeldKV.serves`): a request at retention ``r`` is served from a held entry only when the entry
holds every token the request keeps: the entry holds the whole document (``r_t = 1``, any ``r`` and method),
or the method is ``importance`` and ``kept_count(n, r) <= kept_count(n, r_t)`` (the request's top-``r`` is a
prefix of the same order, hence a subset of the held tokens). Otherwise the tier reports a *partial miss* and
the lookup falls through to the next tier or the store; a request at ``r = 1`` is therefore never served
from a partly held document (it reads the store), and neither are the ``random``/``recency`` evaluation
baselines. A served request gets its own top-``r`` subset (:meth:`HeldKV.materialise`): the same tokens a
read of the store at ``r`` gives, dequantised (within int8 error when ``int8``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlink_rag.retention import check_retention, kept_count, kept_positions
from kvlink_rag.types import DocumentKV, RetainedKV
from store.records.quant import QuantizedTensor, dequantize, quantize_int8


@dataclass(frozen=True)
class TierFormat:
    """How a tier holds documents.

    Attributes:
        retention: fraction of each document's tokens held, 0 < r <= 1 (top of the importance order).
        int8: hold K and V as int8 (keys per channel, values per token) instead of the document's dtype.
    Raises:
        ValueError: retention outside (0, 1].
    """

    retention: float = 1.0
    int8: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "retention", check_retention(self.retention))

    @property
    def lossless(self) -> bool:
        """Holds documents as given (whole, native dtype): entries are plain ``DocumentKV``."""
        return self.retention == 1.0 and not self.int8

    def describe(self) -> dict:
        """``{retention, dtype}`` for stats (dtype ``'int8'`` or ``'native'``)."""
        return {"retention": self.retention, "dtype": "int8" if self.int8 else "native"}


@dataclass(frozen=True)
class HeldKV:
    """A document as a lossy tier holds it.

    Attributes:
        keys, values: ``[layers, kv_heads, held, head_dim]`` in ``dtype``, or their int8
            :class:`~store.records.quant.QuantizedTensor` (keys ``axis='channel'``, values ``axis='token'``);
            tokens sorted by position.
        positions: ``[held]`` int64 (CPU) sorted offsets of the held tokens within the document.
        token_ids: ``[num_tokens]`` int64 ids of the whole document.
        importance: ``[num_tokens]`` float32 scores (the order retention follows), or None (positional order).
        retention: the retention held (the format's).
        num_tokens: the whole document's length.
        dtype: the document's KV dtype (what :meth:`materialise` returns).
    """

    keys: torch.Tensor | QuantizedTensor
    values: torch.Tensor | QuantizedTensor
    positions: torch.Tensor
    token_ids: torch.Tensor
    fingerprint: str
    encoding: str
    importance: torch.Tensor | None
    retention: float
    num_tokens: int
    dtype: torch.dtype

    @property
    def int8(self) -> bool:
        return isinstance(self.keys, QuantizedTensor)

    @property
    def complete(self) -> bool:
        """Every token of the document is held."""
        return int(self.positions.numel()) == self.num_tokens

    @property
    def nbytes(self) -> int:
        """Bytes charged to the tier: K and V (with int8 scales and zeros), positions, token ids, importance."""
        def size(t) -> int:
            return t.nbytes if isinstance(t, QuantizedTensor) else t.numel() * t.element_size()

        extra = [self.positions, self.token_ids] + ([self.importance] if self.importance is not None else [])
        return size(self.keys) + size(self.values) + sum(size(t) for t in extra)

    def serves(self, retention: float, method: str = "importance") -> bool:
        """Whether every token a request at ``retention`` with ``method`` keeps is held (module docstring)."""
        if self.complete:
            return True
        return method == "importance" and kept_count(self.num_tokens, retention) <= int(self.positions.numel())

    def materialise(self, retention: float, method: str = "importance") -> DocumentKV | RetainedKV:
        """The request's view in :attr:`dtype` on the tier's device: the whole document (a complete entry) or
        its top-``retention`` tokens as a :class:`RetainedKV`.

        Raises:
            ValueError: :meth:`serves` is False (a partial entry is never served with fewer tokens than asked).
        """
        if not self.serves(retention, method):
            raise ValueError(f"entry holds retention {self.retention}; cannot serve {retention} ({method})")
        if self.complete:
            return DocumentKV(_rows(self.keys, None, self.dtype), _rows(self.values, None, self.dtype),
                              self.token_ids, self.fingerprint, self.encoding, self.importance)
        keep = kept_positions(self.importance, self.num_tokens, retention)
        rows = torch.searchsorted(self.positions, keep)  # keep is a subset of positions (same order's prefix)
        return RetainedKV(_rows(self.keys, rows, self.dtype), _rows(self.values, rows, self.dtype), keep,
                          self.num_tokens, self.fingerprint, self.encoding, retention)


def _rows(x: torch.Tensor | QuantizedTensor, rows: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Token rows ``rows`` (all when None) of ``x`` ``[layers, kv_heads, held, head_dim]`` in ``dtype``."""
    if rows is not None:
        rows = rows.to(x.q.device if isinstance(x, QuantizedTensor) else x.device)
    if not isinstance(x, QuantizedTensor):
        return x if rows is None else x[:, :, rows]
    if rows is None:
        return dequantize(x, dtype)
    # per-channel scales ([L, H, 1, D]) cover every row; per-token ones ([L, H, held, 1]) are gathered
    scale, zero = (x.scale, x.zero) if x.axis == "channel" else (x.scale[:, :, rows], x.zero[:, :, rows])
    return dequantize(QuantizedTensor(x.q[:, :, rows], scale, zero, x.axis, x.source_dtype), dtype)


def _held(k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, fmt: TierFormat, device: torch.device, token_ids,
          fingerprint: str, encoding: str, importance: torch.Tensor | None, n: int) -> HeldKV:
    """A :class:`HeldKV` of the rows ``k``, ``v`` ``[layers, kv_heads, held, head_dim]`` at offsets ``pos``."""
    k, v = k.to(device), v.to(device)
    dtype = k.dtype
    if fmt.int8:
        k, v = quantize_int8(k, axis="channel"), quantize_int8(v, axis="token")
    imp = importance.cpu() if importance is not None else None
    return HeldKV(k, v, pos.cpu(), token_ids, fingerprint, encoding, imp, fmt.retention, n, dtype)


def hold_part(part: RetainedKV, importance: torch.Tensor | None, token_ids: torch.Tensor, fmt: TierFormat,
              device: torch.device) -> HeldKV | None:
    """A retained read (``part``, e.g. a prefix read of the store at ``part.retention``) as a tier of format
    ``fmt`` holds it, or None when ``part`` lacks some of the tokens ``fmt.retention`` keeps (or ``fmt`` holds
    whole documents).

    Args:
        importance: ``[doc_tokens]`` scores whose order the part follows (``store.records.ordered_layout.record_importance``
            of the record read; None: positional order).
        token_ids: ``[doc_tokens]`` int64 ids of the whole document.
    """
    n = part.doc_tokens
    if fmt.retention == 1.0 or kept_count(n, fmt.retention) > int(part.positions.numel()):
        return None
    pos = kept_positions(importance, n, fmt.retention)
    rows = torch.searchsorted(part.positions, pos)
    if not torch.equal(part.positions[rows.clamp_max(part.positions.numel() - 1)], pos):
        return None  # not the same order's prefix
    rows = rows.to(part.keys.device)
    return _held(part.keys[:, :, rows], part.values[:, :, rows], pos, fmt, device, token_ids, part.fingerprint,
                 part.encoding, importance, n)


def hold(kv: DocumentKV, fmt: TierFormat, device: torch.device) -> HeldKV:
    """``kv`` as a tier of format ``fmt`` on ``device`` holds it (top-``fmt.retention`` tokens, int8 if asked).

    Raises:
        TypeError: ``kv`` is not a whole document (a held or retained part is never re-held).
    """
    if not isinstance(kv, DocumentKV):
        raise TypeError(f"a tier holds whole documents, not {type(kv).__name__}")
    n = kv.num_tokens
    pos = kept_positions(kv.importance, n, fmt.retention) if fmt.retention < 1.0 else torch.arange(n)
    idx = pos.to(kv.keys.device)
    # k, v: [layers, kv_heads, held, head_dim]
    return _held(kv.keys[:, :, idx], kv.values[:, :, idx], pos, fmt, device, kv.token_ids, kv.fingerprint,
                 kv.encoding, kv.importance, n)

"""Decoding a stored layer in its stored token order into a consumer's rows: the query path's read half
(:mod:`store.records.layer_decode` decodes in position order). An importance-ordered record's rows go as stored,
their offsets carried as data by the reader (:func:`store.records.ordered_layout.token_order`)."""

from __future__ import annotations

import functools
import math
import warnings
from typing import NamedTuple

import numpy as np
import torch

from kvlink_rag.rows import RowWriter, StoredRows, widens
from kvlink_rag.types import parse_dtype
from store.records import ordered_layout
from store.records.errors import CorruptRecordError
from store.records.codec import INT8_NAMES
from store.records.layer_decode import check_layer, dequantize_into, header_of, materialise, verified_views
from store.records.one_thread import copy_bytes_into, copy_into, write_into


def decode_layer_stored_into(buf, meta: dict, layer: int, k_out: torch.Tensor, v_out: torch.Tensor,
                             keys: RowWriter | None = None, values: RowWriter | None = None, start: int = 0,
                             verified: bool = False) -> None:
    """Verify and decode layer ``layer`` into ``k_out``/``v_out`` ``[H, T, D]`` in the record's stored token order:
    an importance-ordered record's rows as stored (row ``r`` is position ``token_order[r]``: the reader carries
    the order as data, :func:`store.records.ordered_layout.token_order`), any other record in position order.
    One pass over the bytes after the checksum: a float record of the outputs' dtype goes from the buffer
    straight through the writers (token-major rows transposed on the way, no gather); others are decoded first.

    Args:
        k_out, v_out: CPU outputs of any float dtype (converted on the copy); views allowed, e.g. a slice
            ``[:, a:b]`` of a buffer joining several documents.
        keys, values: :class:`~kvlink_rag.types.RowWriter` s that write the stored keys / values (None: copied
            as stored); ``start`` is passed on to them (the outputs' first row in the whole fill).
        verified: these very bytes already matched their checksum in this process (not hashed again:
            :mod:`store.records.verified`).
    Raises:
        CorruptRecordError: missing buffer, checksum mismatch or a payload that does not fit the outputs.
    """
    views = verified_views(buf, meta, layer, verified)
    ordered = "token_order" in meta
    try:
        if meta["dtype"] == "int8":
            if not ordered and keys is None and values is None:  # straight into the outputs
                dequantize_into({name: materialise(*views[name]) for name in INT8_NAMES}, meta, k_out, v_out)
                return
            if ordered:  # dequantised in stored order (float32 rows [T, H, D]), then one transposed copy
                k, v = (x.transpose(0, 1) for x in ordered_layout.decode_ordered(buf, meta, layer))
            else:
                k, v = torch.empty(k_out.shape, dtype=k_out.dtype), torch.empty(v_out.shape, dtype=v_out.dtype)
                dequantize_into({name: materialise(*views[name]) for name in INT8_NAMES}, meta, k, v)
            _fits(k_out, k.shape, transpose=False)
            write_into(k_out, k, keys, start)
            write_into(v_out, v, values, start)
            return
        stored = [(out, writer, *views[name]) for name, out, writer in (("k", k_out, keys), ("v", v_out, values))]
        for out, _, dtype, shape, raw in stored:
            _fits(out, shape, transpose=ordered)
            if raw.nbytes != math.prod(shape) * dtype.itemsize:
                raise CorruptRecordError("layer payload size does not match its shape")
    except (KeyError, ValueError, RuntimeError) as e:
        raise CorruptRecordError(f"layer {layer} could not be parsed: {e}") from None
    for out, writer, dtype, shape, raw in stored:  # the record is sound: what fails now is not its fault
        if writer is not None and dtype == out.dtype:
            writer(out, raw, ordered, start)  # straight from the buffer
        elif writer is not None:
            write_into(out, _stored_tensor(dtype, shape, raw, ordered), writer, start)
        else:
            _copy_view(out, dtype, shape, raw, transpose=ordered)


class RowsPlan(NamedTuple):
    """Where a verified layer buffer holds its keys and values as rows a fill can take as they are
    (:func:`rows_plan`): byte ranges ``[k0, k1)`` and ``[v0, v1)`` of the buffer, the fill's dtype and shape
    ``[kv_heads, n, head_dim]`` they were checked against, their layout (token-major ``[n, H, D]`` for an
    importance-ordered record) and whether they are bfloat16 rows for a float32 fill (widened by the writer)."""

    k0: int
    k1: int
    v0: int
    v1: int
    token_major: bool
    dtype: torch.dtype
    shape: tuple[int, int, int]
    widen: bool = False

    def parts(self, raw: np.ndarray, start: int) -> tuple[StoredRows, StoredRows]:
        """The rows as :class:`~kvlink_rag.rows.StoredRows` at row ``start`` of a fill: views of ``raw`` (the
        buffer's bytes as a flat uint8 array, no copy)."""
        return (StoredRows(raw[self.k0:self.k1], self.token_major, start, self.widen),
                StoredRows(raw[self.v0:self.v1], self.token_major, start, self.widen))


def stored_rows(buf, meta: dict, layer: int, dtype: torch.dtype, shape: tuple[int, int, int], start: int,
                verified: bool = False) -> tuple[StoredRows, StoredRows] | None:
    """Layer ``layer``'s keys and values as :class:`~kvlink_rag.rows.StoredRows` at row ``start`` of a fill, views
    of the verified buffer ``buf`` (no copy; valid while ``buf`` is), when the record stores ``shape``
    ``[kv_heads, n, head_dim]`` rows of ``dtype``, or bfloat16 rows for a float32 ``dtype`` (widened by the writer;
    token-major for an importance-ordered record); None for any other pair (int8, float16, or float32 into a
    bfloat16 fill: :func:`decode_layer_stored_into` converts those).

    Raises:
        CorruptRecordError: missing buffer, checksum mismatch, or a tensor that does not fit ``shape``.
    """
    plan = rows_plan(buf, meta, layer, dtype, shape, verified)
    return None if plan is None else plan.parts(np.frombuffer(buf, dtype=np.uint8), start)


def rows_plan(buf, meta: dict, layer: int, dtype: torch.dtype, shape: tuple[int, int, int],
              verified: bool = False) -> RowsPlan | None:
    """:func:`stored_rows`' checks of layer ``layer``'s buffer (its checksum unless ``verified``, its header
    against ``shape`` rows of the stored dtype) and where the rows lie in it; None when rows of the stored dtype
    cannot go to a ``dtype`` fill as they are or widened (:func:`kvlink_rag.rows.widens`; returned before the
    checksum). The header's check is made once per distinct header and fill shape (every
    layer of a document shares one).

    Raises:
        CorruptRecordError: missing buffer, checksum mismatch, or a tensor that does not fit ``shape``.
    """
    stored = None if meta["dtype"] == "int8" else parse_dtype(meta["dtype"])
    widen = None if stored is None else widens(stored, dtype)
    if widen is None:
        return None
    check_layer(buf, meta, layer, verified)
    ordered = "token_order" in meta
    try:
        at, header = header_of(buf)
        plan = _rows_plan(header, stored, tuple(shape), ordered)
    except (KeyError, ValueError) as e:
        raise CorruptRecordError(f"layer {layer} could not be parsed: {e}") from None
    if plan is None:
        return None
    if isinstance(plan, str) or at + plan[-1][1] > len(buf):
        raise CorruptRecordError(plan if isinstance(plan, str) else f"layer {layer} is shorter than its header says")
    (k0, k1), (v0, v1) = plan
    return _interned(RowsPlan(at + k0, at + k1, at + v0, at + v1, ordered, dtype, tuple(shape), widen))


@functools.lru_cache(maxsize=1024)
def _interned(plan: RowsPlan) -> RowsPlan:
    """One object per distinct plan (every layer of a document, and documents of one length, share one), so the
    plans :data:`store.records.verified.VERIFIED` keeps cost a reference each."""
    return plan


@functools.lru_cache(maxsize=256)
def _rows_plan(header: tuple, dtype: torch.dtype, shape: tuple[int, int, int], ordered: bool
               ) -> tuple[tuple[int, int], tuple[int, int]] | str | None:
    """The ``(start, end)`` payload offsets of ``k`` and ``v`` when the parsed ``header`` stores them as ``shape``
    rows of ``dtype`` (the record's stored dtype; ``[n, H, D]`` when ``ordered``), None for another dtype, else the
    reason they do not fit.

    Raises:
        KeyError: ``k`` or ``v`` is missing.
    """
    tensors = {name: (got, got_shape, begin, end) for name, got, got_shape, begin, end in header}
    want = [shape[1], shape[0], shape[2]] if ordered else list(shape)
    plan = []
    for name in ("k", "v"):
        got, got_shape, begin, end = tensors[name]
        if got != dtype:
            return None
        if list(got_shape) != want or end - begin != math.prod(want) * dtype.itemsize:
            return f"stored tensor {list(got_shape)} does not fit the output {list(shape)}"
        plan.append((begin, end))
    return plan[0], plan[1]


def _stored_tensor(dtype: torch.dtype, shape: list[int], raw: np.ndarray, token_major: bool) -> torch.Tensor:
    """A read-only view of a stored tensor as ``[H, T, D]`` (transposed from ``[T, H, D]`` when token-major)."""
    with warnings.catch_warnings():  # a read-only LMDB/Redis buffer: only read here
        warnings.simplefilter("ignore", UserWarning)
        src = torch.from_numpy(raw).view(dtype).view(shape)
    return src.transpose(0, 1) if token_major else src


def _fits(out: torch.Tensor, shape, transpose: bool) -> None:
    """Raise :class:`CorruptRecordError` unless ``shape`` (``[T, H, D]`` token-major when ``transpose``, else
    ``[H, T, D]``) is the shape of ``out`` ``[H, T, D]``."""
    want = [out.shape[1], out.shape[0], out.shape[2]] if transpose else list(out.shape)
    if list(shape) != want:
        raise CorruptRecordError(f"stored tensor {list(shape)} does not fit the output {list(out.shape)}")


def _copy_view(out: torch.Tensor, dtype: torch.dtype, shape: list[int], raw: np.ndarray, transpose: bool) -> None:
    """Copy a stored tensor (a read-only byte view, token-major ``[T, H, D]`` when ``transpose``) into ``out``
    ``[H, T, D]``, converting its dtype: one strided pass on this thread, no intermediate tensor."""
    if out.dtype == dtype and out.device.type == "cpu":
        copy_bytes_into(out, raw, tuple(shape), transpose)  # whole rows, straight from the buffer
        return
    copy_into(out, _stored_tensor(dtype, shape, raw, transpose))

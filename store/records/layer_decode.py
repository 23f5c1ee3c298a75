"""Decoding a stored document's layers into preallocated tensors (the read half of :mod:`store.records.codec`).

Decoding reads straight from an LMDB ``buffers=True`` memoryview (or Redis bytes), verifies each layer's
checksum against the meta record and copies each tensor once into its destination: ``[L, H, T, D]`` for a
whole document (:func:`decode_layers_into`, :func:`decode_document`) or ``[H, T, D]`` for one layer
(:func:`decode_layer_into`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator

import numpy as np
import torch

from kvlink_rag.types import DocumentKV, parse_dtype
from store.records import ordered_layout
from store.records.codec import INT8_NAMES, KEY_AXIS, VALUE_AXIS, checksum, decode_ids, target_dtype
from store.records.errors import CorruptRecordError
from store.records.quant import QuantizedTensor, dequantize

_ST_DTYPES: dict[str, torch.dtype] = {
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "I8": torch.int8,
    "I64": torch.int64,
}


def _views(buf) -> dict[str, tuple[torch.dtype, list[int], np.ndarray]]:
    """Name -> (dtype, shape, read-only uint8 numpy view into ``buf``) for every tensor of a
    safetensors buffer. (numpy, not ``torch.frombuffer``: plain memcpy, no read-only warning, and
    torch's multi-threaded ``copy_`` can be pathologically slow on small machines.)"""
    at, header = header_of(buf)
    return {name: (dtype, shape, np.frombuffer(buf, dtype=np.uint8, count=end - start, offset=at + start))
            for name, dtype, shape, start, end in header}


@functools.lru_cache(maxsize=256)
def _header(raw: bytes) -> tuple:
    """Parsed safetensors header: ``(name, dtype, shape, start, end)`` per tensor. Memoised: every layer
    of a document (and documents of one length) share one header, so it is parsed once, not per layer."""
    header = json.loads(raw)
    return tuple((name, _ST_DTYPES[info["dtype"]], tuple(info["shape"]), *info["data_offsets"])
                 for name, info in header.items() if name != "__metadata__")


def materialise(dtype: torch.dtype, shape: list[int], raw: np.ndarray) -> torch.Tensor:
    """Aligned tensor of ``dtype``/``shape`` from a uint8 view (one copy)."""
    return torch.from_numpy(raw.copy()).view(dtype).view(shape)


def _fill(dst: torch.Tensor, dtype: torch.dtype, shape: list[int], raw: np.ndarray) -> None:
    if list(dst.shape) != list(shape):
        raise CorruptRecordError(f"layer shape {shape} does not match the meta shape {list(dst.shape)}")
    if dst.dtype == dtype and dst.is_contiguous() and dst.device.type == "cpu":
        if raw.nbytes != dst.numel() * dst.element_size():
            raise CorruptRecordError("layer payload size does not match its shape")
        dst.view(torch.uint8).view(-1).numpy()[:] = raw  # the one copy, byte for byte
    else:
        dst.copy_(materialise(dtype, shape, raw))


def decode_layers_into(bufs: Iterable, meta: dict, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Verify and decode every layer of a record into ``keys``/``values`` ``[L, H, T, D]``.

    ``bufs`` yields the ``L`` layer buffers in order. On CPU each tensor of each layer is one checksum
    and one memcpy into a byte view of a whole-document tensor made once: float records of the output
    dtype land in the outputs directly; int8 records are gathered and dequantised once per document
    (bit-identical to per-layer dequantisation). Other cases go through :func:`decode_layer_into`.

    Raises:
        CorruptRecordError: a missing buffer, checksum mismatch or payload that does not fit the meta.
    """
    cpu = (keys.device.type == values.device.type == "cpu" and keys.is_contiguous() and values.is_contiguous()
           and keys.dtype == values.dtype)
    int8 = meta["dtype"] == "int8"
    if cpu and not int8 and "token_order" in meta and parse_dtype(meta["dtype"]) == keys.dtype:
        inverse = torch.argsort(ordered_layout.token_order(meta))  # checked and inverted once per document
        for i, buf in enumerate(bufs):
            verified_views(buf, meta, i)
            ordered_layout.gather_layer_into(buf, inverse, keys[i], values[i])
        return
    if not cpu or not (int8 or parse_dtype(meta["dtype"]) == keys.dtype) or "token_order" in meta:
        for i, buf in enumerate(bufs):
            decode_layer_into(buf, meta, i, keys[i], values[i])
        return
    n_layers = keys.shape[0]
    if int8:
        parts: dict[str, tuple[torch.Tensor, np.ndarray]] = {}
    else:  # parts: name -> (whole-document tensor [L, ...], its bytes [L, layer bytes])
        parts = {"k": (keys, keys.view(torch.uint8).numpy().reshape(n_layers, -1)),
                 "v": (values, values.view(torch.uint8).numpy().reshape(n_layers, -1))}
    for i, buf in enumerate(bufs):
        views = verified_views(buf, meta, i)
        try:
            for name in INT8_NAMES if int8 else ("k", "v"):
                dtype, shape, raw = views[name]
                if name not in parts:
                    dst = torch.empty((n_layers, *shape), dtype=dtype)
                    parts[name] = (dst, dst.view(torch.uint8).numpy().reshape(n_layers, -1))
                dst, rows = parts[name]
                if (dtype, list(shape), raw.nbytes) != (dst.dtype, list(dst.shape[1:]), rows.shape[1]):
                    raise CorruptRecordError(f"layer {i} tensor {name} does not match the meta shape")
                rows[i] = raw  # the one copy, byte for byte
        except (KeyError, ValueError) as e:
            raise CorruptRecordError(f"layer {i} could not be parsed: {e}") from None
    if int8:
        dequantize_into({name: dst for name, (dst, _) in parts.items()}, meta, keys, values)


def check_layer(buf, meta: dict, layer: int, verified: bool = False) -> None:
    """Raise :class:`CorruptRecordError` unless layer ``layer``'s buffer is there and matches the meta's checksum
    (not hashed again when ``verified``)."""
    if buf is None or not verified and checksum(buf, meta["format_version"]) != meta["checksum"]["layers"][layer]:
        raise CorruptRecordError(f"layer {layer} failed its checksum")


def header_of(buf) -> tuple[int, tuple]:
    """The payload's start in a safetensors buffer and its parsed header (memoised by the header's bytes:
    ``(name, dtype, shape, start, end)`` per tensor, offsets from the payload's start).

    Raises:
        KeyError, ValueError: an unparsable header.
    """
    n = int.from_bytes(bytes(buf[:8]), "little")
    return 8 + n, _header(bytes(buf[8: 8 + n]))


def verified_views(buf, meta: dict, layer: int, verified: bool = False
                    ) -> dict[str, tuple[torch.dtype, list[int], np.ndarray]]:
    """:func:`_views` of layer ``layer``'s buffer after its checksum matched the meta's (not hashed again when
    ``verified``).

    Raises:
        CorruptRecordError: missing buffer, checksum mismatch or unparsable header.
    """
    check_layer(buf, meta, layer, verified)
    try:
        return _views(buf)
    except (KeyError, ValueError) as e:
        raise CorruptRecordError(f"layer {layer} could not be parsed: {e}") from None


def dequantize_into(tensors: dict[str, torch.Tensor], meta: dict, k_out: torch.Tensor, v_out: torch.Tensor) -> None:
    """Dequantise int8 ``k``/``v`` (with their ``*_scale``/``*_zero``) into ``k_out``/``v_out`` of the same
    shape (one layer ``[H, T, D]`` or a whole document ``[L, H, T, D]``), in float32 arithmetic.

    Raises:
        CorruptRecordError: a shape does not match its output.
    """
    src = parse_dtype(meta["source_dtype"])
    for name, out, axis in (("k", k_out, meta.get("key_axis") or KEY_AXIS), ("v", v_out, VALUE_AXIS)):
        q = tensors[name]
        if list(q.shape) != list(out.shape):
            raise CorruptRecordError(f"int8 shape {list(q.shape)} does not match {list(out.shape)}")
        qt = QuantizedTensor(q=q, scale=tensors[f"{name}_scale"], zero=tensors[f"{name}_zero"], axis=axis,
                             source_dtype=src)
        out.copy_(dequantize(qt, torch.float32))


def decode_layer_into(buf, meta: dict, layer: int, k_out: torch.Tensor, v_out: torch.Tensor) -> None:
    """Verify and decode layer ``layer`` of a record into ``k_out``/``v_out`` ``[H, T, D]``.

    Raises:
        CorruptRecordError: missing buffer, checksum mismatch or unparsable payload.
    """
    views = verified_views(buf, meta, layer)
    if "token_order" in meta:  # importance-ordered layer: decode, then back to positional order
        ordered_layout.decode_ordered_into(buf, meta, layer, k_out, v_out)
        return
    try:
        if meta["dtype"] != "int8":
            _fill(k_out, *views["k"])
            _fill(v_out, *views["v"])
            return
        dequantize_into({name: materialise(*views[name]) for name in INT8_NAMES}, meta, k_out, v_out)
    except (KeyError, ValueError, RuntimeError) as e:
        raise CorruptRecordError(f"layer {layer} could not be parsed: {e}") from None


def decode_document(meta: dict, ids: bytes | memoryview | None, layers: Iterable,
                    dtype: torch.dtype | str | None = None) -> DocumentKV:
    """The whole document of a record on CPU: its ids buffer and its ``L`` layer buffers (in order; an
    iterator may fetch them as they are needed) verified and decoded into keys/values ``[L, H, T, D]`` of
    ``dtype`` (default: as stored; int8 records dequantised to their source dtype).

    Raises:
        CorruptRecordError: the ids or a layer failed their checks (whatever ``layers`` raises passes through).
    """
    token_ids = decode_ids(ids, meta)
    L, H, T, D = meta["shape"]
    out = target_dtype(meta, dtype)
    keys, values = torch.empty((L, H, T, D), dtype=out), torch.empty((L, H, T, D), dtype=out)
    decode_layers_into(layers, meta, keys, values)
    return DocumentKV(keys=keys, values=values, token_ids=token_ids, fingerprint=meta["fingerprint"],
                      encoding=meta["encoding"], importance=ordered_layout.record_importance(meta))


def decode_layer_stream(meta: dict, layers: Iterable, dtype: torch.dtype | str | None = None
                        ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(k, v)`` ``[H, T, D]`` of each layer buffer of ``layers`` (in order) as it arrives, verified and
    decoded into new tensors of ``dtype`` (as :func:`decode_document`).

    Raises:
        CorruptRecordError: a layer failed its checks (whatever ``layers`` raises passes through).
    """
    _, H, T, D = meta["shape"]
    out = target_dtype(meta, dtype)
    for i, buf in enumerate(layers):
        k, v = torch.empty((H, T, D), dtype=out), torch.empty((H, T, D), dtype=out)
        decode_layer_into(buf, meta, i, k, v)
        yield k, v

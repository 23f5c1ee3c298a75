"""Byte layout of one stored document: a JSON meta record, token ids and one safetensors blob per layer.

Layer payload (safetensors bytes), for a document of ``H`` kv heads, ``T`` tokens, head dim ``D``:

- float formats: ``k``, ``v``: ``[H, T, D]`` in the stored dtype (float32, bfloat16 or float16).
- ``int8``: ``k`` int8 ``[H, T, D]`` with ``k_scale``/``k_zero`` float16 ``[H, 1, D]`` (per channel,
  KIVI-style: pre-RoPE keys have stable outlier channels), ``v`` int8 ``[H, T, D]`` with
  ``v_scale``/``v_zero`` float16 ``[H, T, 1]`` (per token). See :mod:`store.records.quant`.

Decoding reads straight from an LMDB ``buffers=True`` memoryview and copies each tensor once into its
destination.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterable

import numpy as np
import safetensors.torch
import torch
import xxhash

from kvlink_rag.retention import retention_order
from kvlink_rag.types import DocumentKV, dtype_name, kv_dtypes, parse_dtype
from store.records import ordered_layout
from store.records.quant import QuantizedTensor, dequantize, quantize_int8
from store.records.errors import CorruptRecordError

FORMAT_VERSION = 3  # 3: optional importance-ordered layers (store.records.ordered_layout); 2: xxh3_64 checksums (~6x
# faster to verify than version 1's xxh64); 1 and 2 stay readable
_HASHES = {1: xxhash.xxh64_hexdigest, 2: xxhash.xxh3_64_hexdigest, 3: xxhash.xxh3_64_hexdigest}
KEY_AXIS = "channel"
VALUE_AXIS = "token"
_INT8_NAMES = ("k", "k_scale", "k_zero", "v", "v_scale", "v_zero")

_ST_DTYPES: dict[str, torch.dtype] = {
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "I8": torch.int8,
    "I64": torch.int64,
}


def checksum(buf, version: int) -> str:
    """Checksum of a bytes-like object (no copy for memoryviews) as 16 hex digits: xxh3_64 for format
    version 2, xxh64 for records written as version 1.

    Raises:
        CorruptRecordError: unknown format version.
    """
    try:
        return _HASHES[version](buf)
    except KeyError:
        raise CorruptRecordError(f"unknown record format version {version}") from None


def validate(kv: DocumentKV) -> None:
    """Check a :class:`DocumentKV` before it is stored.

    Raises:
        ValueError: shapes or dtypes inconsistent, or a dtype other than float32/bfloat16/float16.
    """
    if kv.keys.dim() != 4 or kv.keys.shape != kv.values.shape:
        raise ValueError(f"keys/values must share a 4-D shape, got {tuple(kv.keys.shape)} / {tuple(kv.values.shape)}")
    if kv.keys.dtype != kv.values.dtype or kv.keys.dtype not in kv_dtypes().values():
        raise ValueError(f"unsupported KV dtypes {kv.keys.dtype} / {kv.values.dtype}")
    if kv.token_ids.dim() != 1 or kv.token_ids.numel() != kv.num_tokens:
        raise ValueError(f"token_ids must be [tokens={kv.num_tokens}], got {tuple(kv.token_ids.shape)}")


def encode_layer(k: torch.Tensor, v: torch.Tensor, int8: bool) -> bytes:
    """Safetensors bytes of one layer; ``k``/``v`` are ``[kv_heads, tokens, head_dim]``."""
    k = k.detach().cpu().contiguous()
    v = v.detach().cpu().contiguous()
    if not int8:
        return safetensors.torch.save({"k": k, "v": v})
    qk = quantize_int8(k, axis=KEY_AXIS)
    qv = quantize_int8(v, axis=VALUE_AXIS)
    return safetensors.torch.save(
        {"k": qk.q, "k_scale": qk.scale, "k_zero": qk.zero, "v": qv.q, "v_scale": qv.scale, "v_zero": qv.zero}
    )


def encode_document(kv: DocumentKV, int8: bool = False, tracked: bool = True) -> tuple[dict, bytes, list[bytes]]:
    """``(meta, ids bytes, layer payloads)`` of a whole document: importance-ordered layers
    (:mod:`store.records.ordered_layout`, a retention read is a prefix of each layer) when ``kv.importance`` is set,
    else the positional layout of :func:`encode_layer`.

    Raises:
        ValueError: invalid document (:func:`validate`).
    """
    validate(kv)
    ids = encode_ids(kv.token_ids)
    if kv.importance is None:
        layers = [encode_layer(kv.keys[i], kv.values[i], int8) for i in range(kv.num_layers)]
        return build_meta(kv, layers, ids, int8, tracked), ids, layers
    order = retention_order(kv.importance.cpu(), kv.num_tokens)
    layers = [ordered_layout.encode_layer_ordered(kv.keys[i], kv.values[i], order, int8) for i in range(kv.num_layers)]
    meta = build_meta(kv, layers, ids, int8, tracked)
    meta["token_order"] = order.tolist()
    meta["checksum"]["chunks"] = [ordered_layout.chunk_checksums(b, kv.num_tokens) for b in layers]
    return meta, ids, layers


def encode_ids(token_ids: torch.Tensor) -> bytes:
    """Little-endian int64 bytes of ``token_ids`` ``[tokens]``."""
    return token_ids.detach().cpu().to(torch.int64).contiguous().numpy().tobytes()


def build_meta(kv: DocumentKV, layers: list[bytes], ids: bytes, int8: bool, tracked: bool = True) -> dict:
    """The JSON-able meta record of a document whose payloads are ``layers`` and ``ids``.

    ``tracked``: written for a document record of the catalog (False: an ad-hoc cache of ``ask``/``demo``,
    which no record points at by design; ``store check`` does not report those as unreferenced).
    """
    return {
        "format_version": FORMAT_VERSION,
        "dtype": "int8" if int8 else dtype_name(kv.dtype),
        "source_dtype": dtype_name(kv.dtype),
        "key_axis": KEY_AXIS if int8 else None,
        "shape": list(kv.keys.shape),
        "fingerprint": kv.fingerprint,
        "encoding": kv.encoding,
        "num_tokens": kv.num_tokens,
        "nbytes": sum(len(b) for b in layers) + len(ids),
        "checksum": {"ids": checksum(ids, FORMAT_VERSION), "layers": [checksum(b, FORMAT_VERSION) for b in layers]},
        "created": time.time(),
        "tracked": tracked,
    }


def parse_meta(buf) -> dict:
    """Parse a meta record.

    Raises:
        CorruptRecordError: not JSON, or fields missing.
    """
    try:
        meta = json.loads(bytes(buf))
        n_layers = meta["shape"][0]
        if len(meta["checksum"]["layers"]) != n_layers or len(meta["shape"]) != 4:
            raise ValueError("checksum count does not match the shape")
        if "token_order" in meta and (len(meta["token_order"]) != meta["shape"][2]
                                      or len(meta["checksum"]["chunks"]) != n_layers):
            raise ValueError("token order or chunk checksums do not match the shape")
        return meta
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise CorruptRecordError(f"bad meta record: {e}") from None


def target_dtype(meta: dict, dtype: torch.dtype | str | None) -> torch.dtype:
    """Dtype a reader gets: ``dtype`` if given, else the stored (or, for int8, the source) dtype."""
    if dtype is None:
        return parse_dtype(meta["source_dtype"] if meta["dtype"] == "int8" else meta["dtype"])
    return parse_dtype(dtype) if isinstance(dtype, str) else dtype


def decode_ids(buf, meta: dict) -> torch.Tensor:
    """``[tokens]`` int64 ids of the record described by ``meta`` from a verified buffer (one copy).

    Raises:
        CorruptRecordError: checksum or length mismatch.
    """
    tokens = meta["shape"][2]
    if buf is None or checksum(buf, meta["format_version"]) != meta["checksum"]["ids"] or len(buf) != tokens * 8:
        raise CorruptRecordError("token ids failed their checksum")
    return torch.from_numpy(np.frombuffer(buf, dtype="<i8").copy())


def _views(buf) -> dict[str, tuple[torch.dtype, list[int], np.ndarray]]:
    """Name -> (dtype, shape, read-only uint8 numpy view into ``buf``) for every tensor of a
    safetensors buffer. (numpy, not ``torch.frombuffer``: plain memcpy, no read-only warning, and
    torch's multi-threaded ``copy_`` can be pathologically slow on small machines.)"""
    n = int.from_bytes(bytes(buf[:8]), "little")
    return {name: (dtype, shape, np.frombuffer(buf, dtype=np.uint8, count=end - start, offset=8 + n + start))
            for name, dtype, shape, start, end in _header(bytes(buf[8 : 8 + n]))}


@functools.lru_cache(maxsize=256)
def _header(raw: bytes) -> tuple:
    """Parsed safetensors header: ``(name, dtype, shape, start, end)`` per tensor. Memoised: every layer
    of a document (and documents of one length) share one header, so it is parsed once, not per layer."""
    header = json.loads(raw)
    return tuple((name, _ST_DTYPES[info["dtype"]], info["shape"], *info["data_offsets"])
                 for name, info in header.items() if name != "__metadata__")


def _materialise(dtype: torch.dtype, shape: list[int], raw: np.ndarray) -> torch.Tensor:
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
        dst.copy_(_materialise(dtype, shape, raw))


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
            _verified_views(buf, meta, i)
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
        views = _verified_views(buf, meta, i)
        try:
            for name in _INT8_NAMES if int8 else ("k", "v"):
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
        _dequantize_into({name: dst for name, (dst, _) in parts.items()}, meta, keys, values)


def _verified_views(buf, meta: dict, layer: int) -> dict[str, tuple[torch.dtype, list[int], np.ndarray]]:
    """:func:`_views` of layer ``layer``'s buffer after its checksum matched the meta's.

    Raises:
        CorruptRecordError: missing buffer, checksum mismatch or unparsable header.
    """
    if buf is None or checksum(buf, meta["format_version"]) != meta["checksum"]["layers"][layer]:
        raise CorruptRecordError(f"layer {layer} failed its checksum")
    try:
        return _views(buf)
    except (KeyError, ValueError) as e:
        raise CorruptRecordError(f"layer {layer} could not be parsed: {e}") from None


def _dequantize_into(tensors: dict[str, torch.Tensor], meta: dict, k_out: torch.Tensor, v_out: torch.Tensor) -> None:
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
    views = _verified_views(buf, meta, layer)
    if "token_order" in meta:  # importance-ordered layer: decode, then back to positional order
        ordered_layout.decode_ordered_into(buf, meta, layer, k_out, v_out)
        return
    try:
        if meta["dtype"] != "int8":
            _fill(k_out, *views["k"])
            _fill(v_out, *views["v"])
            return
        _dequantize_into({name: _materialise(*views[name]) for name in _INT8_NAMES}, meta, k_out, v_out)
    except (KeyError, ValueError, RuntimeError) as e:
        raise CorruptRecordError(f"layer {layer} could not be parsed: {e}") from None

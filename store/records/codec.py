"""Byte layout of one stored document: a JSON meta record, token ids and one safetensors blob per layer.

Layer payload (safetensors bytes), for a document of ``H`` kv heads, ``T`` tokens, head dim ``D``:

- float formats: ``k``, ``v``: ``[H, T, D]`` in the stored dtype (float32, bfloat16 or float16).
- ``int8``: ``k`` int8 ``[H, T, D]`` with ``k_scale``/``k_zero`` float16 ``[H, 1, D]`` (per channel,
  KIVI-style: pre-RoPE keys have stable outlier channels), ``v`` int8 ``[H, T, D]`` with
  ``v_scale``/``v_zero`` float16 ``[H, T, 1]`` (per token). See :mod:`store.records.quant`.

Encoding, the meta record and its checks live here; decoding layers into preallocated tensors is
:mod:`store.records.layer_decode`.
"""

from __future__ import annotations

import functools
import json
import time

import numpy as np
import safetensors.torch
import torch
import xxhash

from kvlink_rag.retention import retention_order
from kvlink_rag.types import DocumentKV, dtype_name, kv_dtypes, parse_dtype
from store.records import ordered_layout
from store.records.quant import quantize_int8
from store.records.errors import CorruptRecordError

FORMAT_VERSION = 3  # 3: optional importance-ordered layers (store.records.ordered_layout); 2: xxh3_64 checksums (~6x
# faster to verify than version 1's xxh64); 1 and 2 stay readable
_HASHES = {1: xxhash.xxh64_hexdigest, 2: xxhash.xxh3_64_hexdigest, 3: xxhash.xxh3_64_hexdigest}
KEY_AXIS = "channel"
VALUE_AXIS = "token"
INT8_NAMES = ("k", "k_scale", "k_zero", "v", "v_scale", "v_zero")


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
    """Parse a meta record. The dict is shared by every reader of the same bytes (memoised: a layer stream
    read each document's meta twice, ~6% of a 4k-token load on the development machine): read it, never change it.

    Raises:
        CorruptRecordError: not JSON, or fields missing.
    """
    return _parse_meta(bytes(buf))


@functools.lru_cache(maxsize=256)
def _parse_meta(raw: bytes) -> dict:
    try:
        meta = json.loads(raw)
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

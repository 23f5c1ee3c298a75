"""Importance-ordered layer records: reading a fraction of a document is reading a prefix of each layer.

A document stored with importance scores (:attr:`kvlink_rag.types.DocumentKV.importance`) keeps, in its meta,
``token_order``: the positions of its tokens in retention order (sinks first, then importance descending,
:func:`kvlink_rag.retention.retention_order`), and each layer's safetensors payload holds its tokens in that
order, *token-major* (the token axis first, so the first ``m`` tokens are one contiguous byte range per
tensor):

- float: ``k``, ``v`` ``[T, H, D]``;
- int8: ``k``, ``v`` int8 ``[T, H, D]``, ``v_scale``/``v_zero`` float16 ``[T, H, 1]`` (per token), and
  ``k_scale``/``k_zero`` float16 ``[H, 1, D]`` (per channel over the whole document, read whole).

Besides the whole-layer checksum of every record, the meta's ``checksum.chunks[layer]`` holds one xxh3_64
checksum per tenth of the tokens (:data:`CHUNKS`): chunk ``c`` covers tokens ``[bound(c), bound(c+1))`` of
every token-major tensor (names sorted), and chunk 0 also the header and the whole tensors. A reader of the
first ``m`` tokens verifies and touches only the chunks that cover them, so the bytes read scale with
``m / T`` (to within one chunk).
"""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import safetensors.torch
import torch
import xxhash

from kvlink_rag.retention import check_retention, kept_count
from kvlink_rag.types import parse_dtype
from store.records.quant import QuantizedTensor, dequantize, quantize_int8
from store.records.errors import CorruptRecordError
from store.records.one_thread import bytes_rows, rows_view

CHUNKS = 10
TOKEN_MAJOR = ("k", "v", "v_scale", "v_zero")
_ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I8": torch.int8}


def chunk_bounds(tokens: int) -> list[int]:
    """``CHUNKS + 1`` token bounds ``ceil(c * T / CHUNKS)`` of the checksum chunks."""
    return [math.ceil(c * tokens / CHUNKS) for c in range(CHUNKS + 1)]


def encode_layer_ordered(k: torch.Tensor, v: torch.Tensor, order: torch.Tensor, int8: bool) -> bytes:
    """Safetensors bytes of one layer in retention order, token-major.

    Args:
        k, v: ``[H, T, D]`` in positional order (keys before RoPE).
        order: ``[T]`` int64 positions in retention order.
        int8: quantise (keys per channel over all tokens, values per token) before reordering.
    """
    k, v, order = k.detach().cpu(), v.detach().cpu(), order.cpu()

    def rows(x: torch.Tensor) -> torch.Tensor:  # [H, T, X] -> [T, H, X] in retention order
        return x[:, order].transpose(0, 1).contiguous()

    if not int8:
        return safetensors.torch.save({"k": rows(k), "v": rows(v)})
    qk, qv = quantize_int8(k, axis="channel"), quantize_int8(v, axis="token")
    return safetensors.torch.save({"k": rows(qk.q), "k_scale": qk.scale.contiguous(), "k_zero": qk.zero.contiguous(),
                                   "v": rows(qv.q), "v_scale": rows(qv.scale), "v_zero": rows(qv.zero)})


@functools.lru_cache(maxsize=256)
def _parse_header(raw: bytes) -> tuple:
    """``(name, dtype, shape, start, end)`` per tensor of a safetensors header (offsets in the data section)."""
    header = json.loads(raw)
    return tuple(sorted((name, _ST_DTYPES[info["dtype"]], tuple(info["shape"]), *info["data_offsets"])
                        for name, info in header.items() if name != "__metadata__"))


def _tensors(buf) -> tuple[int, tuple]:
    """Data-section start and the parsed header of a safetensors buffer.

    Raises:
        CorruptRecordError: unparsable header.
    """
    try:
        n = int.from_bytes(bytes(buf[:8]), "little")
        return 8 + n, _parse_header(bytes(buf[8:8 + n]))
    except (KeyError, ValueError, TypeError) as e:
        raise CorruptRecordError(f"ordered layer header could not be parsed: {e}") from None


def _chunk_digests(buf, tokens: int, upto: int = CHUNKS) -> list[str]:
    """xxh3_64 hex digests of the first ``upto`` chunks of an ordered layer (see the module docstring)."""
    data, tensors = _tensors(buf)
    bounds = chunk_bounds(tokens)
    mv = memoryview(buf)
    out = []
    for c in range(upto):
        h = xxhash.xxh3_64()
        if c == 0:
            h.update(mv[:data])
            for name, _, _, start, end in tensors:
                if name not in TOKEN_MAJOR:
                    h.update(mv[data + start:data + end])
        for name, _, _, start, end in tensors:
            if name in TOKEN_MAJOR:
                row = (end - start) // max(1, tokens)
                h.update(mv[data + start + bounds[c] * row:data + start + bounds[c + 1] * row])
        out.append(h.hexdigest())
    return out


def chunk_checksums(buf, tokens: int) -> list[str]:
    """The :data:`CHUNKS` checksums of an ordered layer of ``tokens`` tokens (stored in the meta)."""
    return _chunk_digests(buf, tokens)


def token_order(meta: dict) -> torch.Tensor | None:
    """``[T]`` int64 retention order of an ordered record, or None for a record in positional order (a new
    tensor each call; the check is memoised per order: a layer stream rebuilt and sorted it per document).

    Raises:
        CorruptRecordError: the stored order is not a permutation of the record's tokens.
    """
    order = meta.get("token_order")
    if order is None:
        return None
    return _checked_order(tuple(order), meta["shape"][2]).clone()


@functools.lru_cache(maxsize=256)
def _checked_order(order: tuple[int, ...], tokens: int) -> torch.Tensor:
    t = torch.tensor(order, dtype=torch.long)
    if t.numel() != tokens or not torch.equal(torch.sort(t).values, torch.arange(t.numel())):
        raise CorruptRecordError("token_order is not a permutation of the record's tokens")
    return t


def record_importance(meta: dict) -> torch.Tensor | None:
    """``[T]`` float32 importance that reproduces the stored retention order (``T - rank``; the order is what
    the scores are kept as), or None for a record stored without scores."""
    order = token_order(meta)
    if order is None:
        return None
    scores = torch.empty(order.numel(), dtype=torch.float32)
    scores[order] = torch.arange(order.numel(), 0, -1, dtype=torch.float32)
    return scores


def retained_positions(meta: dict, retention: float) -> torch.Tensor:
    """Sorted ``[kept]`` int64 offsets a read at ``retention`` keeps: the first ``kept_count(T, r)`` of the
    stored order (of the positions, for a record without scores).

    Raises:
        ValueError: retention outside (0, 1]. CorruptRecordError: bad stored order.
    """
    tokens = meta["shape"][2]
    m = kept_count(tokens, check_retention(retention))
    order = token_order(meta)
    return torch.arange(m) if order is None else torch.sort(order[:m]).values


def _rows(buf, data: int, spec: tuple, tokens: int, m: int | None) -> torch.Tensor:
    """Tensor ``spec`` of a layer buffer; only its first ``m`` rows when it is token-major (one copy)."""
    name, dtype, shape, start, end = spec
    count = end - start
    if m is not None and name in TOKEN_MAJOR:
        count, shape = count // max(1, tokens) * m, (m, *shape[1:])
    raw = np.frombuffer(buf, dtype=np.uint8, count=count, offset=data + start)
    return torch.from_numpy(raw.copy()).view(dtype).view(shape)


def decode_ordered(buf, meta: dict, layer: int, tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V token-major ``[m, H, D]`` (float32 for int8 records, else the stored dtype) of the first ``m``
    tokens in retention order (all of them when ``tokens`` is None); a partial read verifies the chunks it
    touches, a whole read is verified by the caller's whole-layer checksum.

    Raises:
        CorruptRecordError: a chunk failed its checksum, or the payload does not fit the meta.
    """
    T = meta["shape"][2]
    m = T if tokens is None else tokens
    if tokens is not None:
        need = next(c for c in range(CHUNKS + 1) if chunk_bounds(T)[c] >= m)
        if _chunk_digests(buf, T, need) != meta["checksum"]["chunks"][layer][:need]:
            raise CorruptRecordError(f"layer {layer} failed its chunk checksum")
    data, tensors = _tensors(buf)
    try:
        t = {spec[0]: _rows(buf, data, spec, T, m if tokens is not None else None) for spec in tensors}
        if meta["dtype"] != "int8":
            return t["k"], t["v"]
        src = torch.float32
        k = dequantize(QuantizedTensor(t["k"].transpose(0, 1), t["k_scale"], t["k_zero"], "channel", src), src)
        v = dequantize(QuantizedTensor(t["v"].transpose(0, 1), t["v_scale"].transpose(0, 1),
                                       t["v_zero"].transpose(0, 1), "token", src), src)
        return k.transpose(0, 1), v.transpose(0, 1)
    except (KeyError, ValueError, RuntimeError) as e:
        raise CorruptRecordError(f"layer {layer} could not be parsed: {e}") from None


def decode_ordered_into(buf, meta: dict, layer: int, k_out: torch.Tensor, v_out: torch.Tensor) -> None:
    """A whole ordered layer (already verified) back in positional order into ``k_out``/``v_out`` ``[H, T, D]``.

    Raises:
        CorruptRecordError: the payload or the stored order does not fit the meta.
    """
    inverse = torch.argsort(token_order(meta))  # position -> row in retention order
    if meta["dtype"] != "int8" and k_out.device.type == "cpu" and parse_dtype(meta["dtype"]) == k_out.dtype:
        gather_layer_into(buf, inverse, k_out, v_out)  # the record's dtype: rows straight into place
        return
    inv = inverse.numpy()
    if meta["dtype"] == "int8":
        k, v = decode_ordered(buf, meta, layer)  # k, v: [T, H, D] in retention order
        k, v = k[torch.from_numpy(inv)], v[torch.from_numpy(inv)]
    else:  # gather the rows straight from the buffer (one copy), then one strided copy into the outputs
        data, tensors = _tensors(buf)
        k, v = (_gathered(buf, data, spec, inv) for spec in tensors)
    if list(k.shape) != [k_out.shape[1], k_out.shape[0], k_out.shape[2]]:
        raise CorruptRecordError(f"layer {layer} shape {list(k.shape)} does not fit {list(k_out.shape)}")
    k_out.copy_(k.transpose(0, 1))
    v_out.copy_(v.transpose(0, 1))


def gather_layer_into(buf, inverse: torch.Tensor, k_out: torch.Tensor, v_out: torch.Tensor) -> None:
    """A whole verified float layer of an ordered record straight into positional order:
    ``out[h, p] = stored row inverse[p]`` (numpy over whole rows of ``D`` elements: a gather into a temporary,
    then one transposed copy, on the calling thread alone; a torch ``index_select`` here opened a second OpenMP
    team beside the consumer's torch work when a reader thread called it).

    Args:
        inverse: ``[T]`` int64 ``argsort(token_order)``: position -> stored row (made once per document).
        k_out, v_out: ``[H, T, D]`` CPU outputs in the record's dtype.
    Raises:
        CorruptRecordError: the payload does not fit the outputs.
    """
    data, tensors = _tensors(buf)
    views = {spec[0]: spec for spec in tensors}
    inv = inverse.numpy()
    try:
        for name, out in (("k", k_out), ("v", v_out)):
            _, dtype, shape, start, end = views[name]
            if dtype != out.dtype or list(shape) != [out.shape[1], out.shape[0], out.shape[2]]:
                raise CorruptRecordError(f"ordered tensor {name} {list(shape)} does not fit {list(out.shape)}")
            raw = np.frombuffer(buf, dtype=np.uint8, count=end - start, offset=data + start)
            rows = bytes_rows(raw, tuple(shape), out.element_size())  # rows: [T, H] whole rows, stored order
            np.copyto(rows_view(out), rows[inv].T)  # -> [H, T] in position order
    except KeyError as e:
        raise CorruptRecordError(f"ordered layer has no tensor {e}") from None
    except ValueError as e:  # the payload does not hold its header's shape
        raise CorruptRecordError(f"ordered layer could not be parsed: {e}") from None


def _gathered(buf, data: int, spec: tuple, rows: np.ndarray) -> torch.Tensor:
    """Token-major tensor ``spec`` of a float layer with its rows taken in the order ``rows`` (one copy)."""
    _, dtype, shape, start, end = spec
    raw = np.frombuffer(buf, dtype=np.uint8, count=end - start, offset=data + start).reshape(shape[0], -1)
    return torch.from_numpy(raw[rows]).view(dtype).view(shape)


def decode_ordered_prefix(buf, meta: dict, layer: int, retention: float, dtype: torch.dtype,
                          order: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V ``[H, kept, D]`` in ``dtype`` of the tokens a read at ``retention`` keeps, sorted by position
    (the offsets are :func:`retained_positions`), reading only a prefix of the layer's bytes.

    Args:
        order: :func:`token_order` of ``meta`` when the caller already has it (one check per document,
            not per layer).
    Raises:
        CorruptRecordError: a touched chunk failed its checksum, or the payload does not fit the meta.
    """
    T = meta["shape"][2]
    m = kept_count(T, check_retention(retention))
    k, v = decode_ordered(buf, meta, layer, m)  # k, v: [m, H, D] in retention order
    idx = torch.argsort((token_order(meta) if order is None else order)[:m])  # -> position order
    return k[idx].to(dtype).transpose(0, 1), v[idx].to(dtype).transpose(0, 1)

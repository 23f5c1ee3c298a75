"""Copies for the store's reader threads, on the calling thread alone.

A reader thread (layer prefetch) runs beside the consumer's torch operations. A torch copy large enough to go
parallel opens a second OpenMP team on the same cores, and both teams then spin at their barriers while the
other holds the cores: on a 2-core machine a ``[3, 4096, 64]`` bfloat16 slice assignment took 484 ms at 2 torch
threads beside another job against 14 ms at 1 (one measurement, 30 layers). numpy copies on the thread that
asks, so these helpers copy through numpy views of the tensors' bytes whenever the dtypes match (any strides),
and fall back to torch only to convert a dtype.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from kvlink_rag.rows import RowWriter, write_rows

_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view (no copy, same strides) of CPU tensor ``t``'s elements as integers of the same width, so
    that bfloat16 (which numpy lacks) is viewed too."""
    return t.view(_SAME_SIZE_INT[t.element_size()]).numpy()


def rows_view(t: torch.Tensor) -> np.ndarray:
    """A numpy view (no copy) of CPU tensor ``t`` ``[..., D]`` (last dimension contiguous) with each last-dimension
    row as one opaque element of ``D * itemsize`` bytes: shape ``t.shape[:-1]``. numpy then moves whole rows in
    a strided copy (a transposing copy of 128-byte rows ran at ~0.8 of a memcpy against ~0.4 element by element).

    Raises:
        ValueError: the last dimension is not contiguous.
    """
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError("rows_view needs a contiguous last dimension")
    return t.view(torch.uint8).numpy().view(_row(t.shape[-1] * t.element_size()))[..., 0]


@functools.lru_cache(maxsize=64)
def _row(nbytes: int) -> np.dtype:
    """The opaque numpy element of ``nbytes`` bytes (one row)."""
    return np.dtype((np.void, nbytes))


def bytes_rows(raw: np.ndarray, shape: tuple[int, ...], itemsize: int) -> np.ndarray:
    """The C-contiguous tensor of ``shape`` ``[..., D]`` held in the bytes ``raw`` (elements of ``itemsize``
    bytes) as a numpy view of shape ``shape[:-1]`` whose elements are whole rows (:func:`rows_view`).

    Raises:
        ValueError: ``raw`` does not hold ``shape``.
    """
    row = _row(shape[-1] * itemsize)
    if raw.nbytes != math.prod(shape[:-1]) * row.itemsize:
        raise ValueError(f"{raw.nbytes} bytes do not hold {list(shape)} of {itemsize}-byte elements")
    return raw.view(row).reshape(shape[:-1])


def copy_bytes_into(out: torch.Tensor, raw: np.ndarray, shape: tuple[int, ...], transpose: bool) -> None:
    """``out`` ``[A, B, D]`` (any strides, contiguous rows) = the C-contiguous tensor held in the bytes ``raw``
    (``shape`` ``[A, B, D]``, or ``[B, A, D]`` copied transposed when ``transpose``) of ``out``'s dtype, on this
    thread alone.

    Raises:
        ValueError: ``raw`` does not hold ``shape`` in ``out``'s dtype.
    """
    src = bytes_rows(raw, shape, out.element_size())
    np.copyto(rows_view(out), src.T if transpose else src)


def write_into(out: torch.Tensor, x: torch.Tensor, writer: RowWriter | None, start: int) -> None:
    """``out`` ``[H, n, D]`` = the tensor ``x`` (same shape, any dtype and strides) through ``writer``
    (:func:`kvlink_rag.types.write_rows`), or, without one, copied on this thread alone (:func:`copy_into`)."""
    if writer is None:
        copy_into(out, x)
    else:
        write_rows(out, x, writer, start)


def copy_into(out: torch.Tensor, src: torch.Tensor) -> None:
    """``out[...] = src`` (same shape, any strides) on this thread alone; a dtype conversion (or a device other
    than the CPU) goes through torch's ``copy_``.

    Raises:
        ValueError: the shapes differ.
    """
    if tuple(out.shape) != tuple(src.shape):
        raise ValueError(f"cannot copy {list(src.shape)} into {list(out.shape)}")
    if out.dtype != src.dtype or out.device.type != "cpu" or src.device.type != "cpu":
        out.copy_(src)
        return
    if out.dim() and (out.shape[-1] == 1 or out.stride(-1) == 1) and (src.shape[-1] == 1 or src.stride(-1) == 1):
        np.copyto(rows_view(out), rows_view(src))
        return
    np.copyto(as_numpy(out), as_numpy(src))

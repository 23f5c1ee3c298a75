"""Row writers of the load path: stored documents' keys rotated at their new positions, and their values, written
into a request's KV blocks in one pass over the stored bytes (:class:`kvlink_rag.types.RowWriter`).

Re-applying RoPE used to be a second pass: the stored keys copied into the blocks, then read back, widened to
float32, rotated through four temporaries and narrowed again (~200 ms for a 4k-token context's 30 layers on the
2-core development machine, against ~16 ms for the fused pass). With the runner's CPU kernels
(:mod:`kvlink_rag.runtime.cpu_kernels`, ``csrc/kv_rows.cpp``) each stored row is read once, rotated in float32
exactly as :func:`kvlink_rag.linking.rope.apply_rope` computes it (bit-identical bytes) and written once; without
them (another CPU, another dtype) the writers copy with numpy and rotate the written slice with
:func:`~kvlink_rag.linking.rope.apply_rope`, so every consumer has one path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..runtime.cpu_kernels import kernels
from .rope import apply_rope

if TYPE_CHECKING:
    from kvlink_rag.rows import RowWriter, StoredRows

_KERNEL_DTYPES = (torch.bfloat16, torch.float32)
_SAME_SIZE_INT = {1: (torch.uint8, np.uint8), 2: (torch.int16, np.int16), 4: (torch.int32, np.int32),
                  8: (torch.int64, np.int64)}


def _kernels(out: torch.Tensor):
    """The compiled kernels when they can write ``out``'s rows here (bfloat16 or float32, an even head_dim of at
    most 256), else None."""
    if out.dtype not in _KERNEL_DTYPES or out.shape[-1] % 2 or out.shape[-1] > 256:
        return None
    return kernels()  # built once per process (functools.cache), None where the CPU or compiler lacks them


def _numpy_rows(out: torch.Tensor, raw, token_major: bool) -> None:
    """``out`` ``[H, n, D]`` = the bytes ``raw`` (``[n, H, D]`` when ``token_major``) with numpy, on this thread.

    Raises:
        ValueError: ``raw`` does not hold ``out``'s bytes.
    """
    H, n, D = out.shape
    src = np.frombuffer(raw, dtype=np.uint8)
    if src.nbytes != out.numel() * out.element_size():
        raise ValueError(f"the stored tensor holds {src.nbytes} bytes, the output {out.numel() * out.element_size()}")
    as_torch, as_numpy = _SAME_SIZE_INT[out.element_size()]
    src = src.view(as_numpy).reshape((n, H, D) if token_major else (H, n, D))
    np.copyto(out.view(as_torch).numpy(), src.transpose(1, 0, 2) if token_major else src)


def _part_rows(out: torch.Tensor, raw) -> int:
    """Rows of ``out`` ``[H, N, D]`` the buffer ``raw`` holds (the numpy fallback's slicing; the kernel checks its own).

    Raises:
        ValueError: ``raw`` holds no whole number of rows.
    """
    H, _, D = out.shape
    row = H * D * out.element_size()
    nbytes = memoryview(raw).nbytes
    if nbytes % row:
        raise ValueError(f"the stored tensor holds {nbytes} bytes, not whole rows of {row}")
    return nbytes // row


def _widened(raw) -> np.ndarray:
    """The bfloat16 rows ``raw`` as the bytes of their float32 values (exact: a bfloat16 is a float32's upper 16
    bits), in the same layout."""
    return (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.uint8)


def _each(writer: RowWriter, out: torch.Tensor, parts: list[StoredRows]) -> None:
    """:meth:`~kvlink_rag.rows.RowWriter.write_many` part by part (no kernel here; ``widen`` parts widened first)."""
    for p in parts:
        if p.widen and out.dtype != torch.float32:
            raise ValueError(f"only bfloat16 rows widen, into float32 blocks, not {out.dtype}")
        raw = _widened(p.raw) if p.widen else p.raw
        n = _part_rows(out, raw)
        if p.start < 0 or p.start + n > out.shape[1]:
            raise ValueError(f"rows {p.start}..{p.start + n} fall outside the output's {out.shape[1]}")
        writer(out[:, p.start:p.start + n], raw, p.token_major, p.start)


def _write_many(writer: RowWriter, out: torch.Tensor, parts: list[StoredRows], cos: torch.Tensor | None,
                sin: torch.Tensor | None) -> None:
    """Every part through one ``kv_rows_many`` call (rows rotated by ``cos``/``sin`` when given), or part by part
    through ``writer`` where the kernels do not take ``out``."""
    kernels = _kernels(out)
    if kernels is None:
        _each(writer, out, parts)
    else:
        kernels.kv_rows_many(out, [p.raw for p in parts], [p.token_major for p in parts], [p.start for p in parts],
                             cos, sin, [p.widen for p in parts])


class CopyRows:
    """A :class:`~kvlink_rag.types.RowWriter` that copies the stored rows as they are (values)."""

    def __call__(self, out: torch.Tensor, raw, token_major: bool, start: int) -> None:
        kernels = _kernels(out)
        if kernels is None:
            _numpy_rows(out, raw, token_major)
        else:
            kernels.kv_rows_into(out, raw, token_major, None, None, 0)

    def write_many(self, out: torch.Tensor, parts: list[StoredRows]) -> None:
        """:meth:`~kvlink_rag.rows.RowWriter.write_many`: every part in one kernel call where it runs."""
        _write_many(self, out, parts, None, None)


copy_rows = CopyRows()


@dataclass(frozen=True)
class RopeRows:
    """A :class:`~kvlink_rag.types.RowWriter` that writes stored keys (before RoPE) rotated at the positions its
    tables were made for: row ``start + r`` of the fill uses ``cos[start + r]`` / ``sin[start + r]``.

    Attributes:
        cos, sin: ``[rows, head_dim]`` float32 tables of the fill's rows, in the order they are written
            (:func:`kvlink_rag.linking.rope.rope_cos_sin` at the rows' positions), on the CPU.
    """

    cos: torch.Tensor
    sin: torch.Tensor

    def __call__(self, out: torch.Tensor, raw, token_major: bool, start: int) -> None:
        kernels = _kernels(out)
        if kernels is not None:
            kernels.kv_rows_into(out, raw, token_major, self.cos, self.sin, start)
            return
        _numpy_rows(out, raw, token_major)
        n = out.shape[1]
        out.copy_(apply_rope(out.float(), self.cos[start:start + n], self.sin[start:start + n]))

    def write_many(self, out: torch.Tensor, parts: list[StoredRows]) -> None:
        """:meth:`~kvlink_rag.rows.RowWriter.write_many`: every part rotated in one kernel call where it runs."""
        _write_many(self, out, parts, self.cos, self.sin)


def block_writers(cos: torch.Tensor, sin: torch.Tensor) -> tuple[RopeRows, CopyRows]:
    """``(keys, values)`` writers of a fill whose rows sit at the positions of ``cos``/``sin`` (``[rows,
    head_dim]``, any float dtype and device: made float32 and contiguous on the CPU here, once per fill)."""
    return RopeRows(cos.to("cpu", torch.float32).contiguous(), sin.to("cpu", torch.float32).contiguous()), copy_rows

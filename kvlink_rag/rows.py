"""Writing stored documents' rows into a consumer's KV buffers: the :class:`RowWriter` contract of the load path
(a plain copy, or keys rotated on the way: :mod:`kvlink_rag.linking.rope_rows`), the rows a store hands it
(:class:`StoredRows`) and the in-memory tensors' way in (:func:`tensor_rows`, :func:`write_rows`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    import torch


class RowWriter(Protocol):
    """Writes one document's stored keys or values of one layer into a consumer's buffer: the load path's one
    pass over the bytes (a plain copy, or keys rotated on the way: :mod:`kvlink_rag.linking.rope_rows`).

    Args:
        out: ``[kv_heads, n, head_dim]`` CPU view with contiguous rows (a slice of a request's KV blocks).
        raw: a C-contiguous buffer (numpy array, memoryview) of exactly ``out``'s elements in ``out``'s dtype,
            ``[n, kv_heads, head_dim]`` when ``token_major`` (an importance-ordered record) else
            ``[kv_heads, n, head_dim]``; valid only during the call (an LMDB page of a read transaction).
        start: the index of ``out``'s first row among the rows of the whole fill (the writer's per-row tables,
            such as RoPE angles, are indexed by it).
    Raises:
        ValueError: ``raw`` does not hold ``out``'s bytes.
    """

    def __call__(self, out: torch.Tensor, raw, token_major: bool, start: int) -> None: ...

    def write_many(self, out: torch.Tensor, parts: list[StoredRows]) -> None:
        """Several documents' rows of one layer into ``out`` ``[kv_heads, N, head_dim]`` (the whole fill's view of
        one layer's blocks) in one call: each part's rows land at ``out[:, part.start : part.start + n]``, as
        ``self(out[:, start:start + n], part.raw, part.token_major, part.start)`` would write them (a ``widen``
        part's bfloat16 rows as their float32 values would be).

        Raises:
            ValueError: a part does not hold whole rows of ``out``, its rows fall outside ``out``, or it widens
                into an ``out`` that is not float32.
        """


class StoredRows(NamedTuple):
    """One document's stored keys or values of one layer, as a :class:`RowWriter` takes them.

    Attributes:
        raw: a C-contiguous buffer of ``n`` rows in the consumer's dtype (bfloat16 when ``widen``),
            ``[n, kv_heads, head_dim]`` when ``token_major`` else ``[kv_heads, n, head_dim]``; valid only while its
            source is (an LMDB page lives as long as the read transaction that handed it out).
        token_major: the rows' layout.
        start: the index of the document's first row among the rows of the whole fill.
        widen: the rows are bfloat16 and the consumer's buffer float32 (the KV dtype where the CPU lacks native
            bfloat16): the writer widens them on the way, exactly.
    """

    raw: object
    token_major: bool
    start: int  # a tuple, not a dataclass: one is made per document and layer on the load path
    widen: bool = False


def widens(stored: torch.dtype, dtype: torch.dtype) -> bool | None:
    """Whether rows stored as ``stored`` reach a ``dtype`` buffer as :class:`StoredRows`: False as they are (the
    same dtype), True widened (bfloat16 rows into float32), None not at all (decoded and converted instead)."""
    if stored == dtype:
        return False
    import torch

    return True if (stored, dtype) == (torch.bfloat16, torch.float32) else None


def tensor_rows(x: torch.Tensor, dtype: torch.dtype, shape: tuple[int, int, int], start: int) -> StoredRows | None:
    """The in-memory layer tensor ``x`` ``[kv_heads, n, head_dim]`` as :class:`StoredRows` starting at row ``start``
    of a ``dtype`` fill (a view of its bytes, no copy; bfloat16 into float32 widened by the writer), or None when it
    cannot be handed over as it is (another dtype pair, shape or device, or not contiguous: the caller writes it
    through :func:`write_rows`)."""
    widen = widens(x.dtype, dtype)
    if widen is None or tuple(x.shape) != tuple(shape) or x.device.type != "cpu" or not x.is_contiguous():
        return None
    import torch

    return StoredRows(x.view(torch.uint8).numpy(), False, start, widen)


def stage_tensors(k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype, shape: tuple[int, int, int], start: int,
                  k_parts: list[StoredRows], v_parts: list[StoredRows]) -> bool:
    """Append the in-memory layer tensors ``k`` and ``v`` (``[kv_heads, n, head_dim]``) to ``k_parts`` /
    ``v_parts`` as :class:`StoredRows` at row ``start`` when both can be handed over as they are
    (:func:`tensor_rows`); else append nothing and return False (the caller writes them through
    :func:`write_rows`)."""
    kr, vr = tensor_rows(k, dtype, shape, start), tensor_rows(v, dtype, shape, start)
    return add_parts(None if kr is None or vr is None else (kr, vr), k_parts, v_parts)


def add_parts(parts: tuple[StoredRows, StoredRows] | None, k_parts: list[StoredRows], v_parts: list[StoredRows]
              ) -> bool:
    """Append one document's staged ``(keys, values)`` rows of a layer to ``k_parts`` / ``v_parts``; with None
    (nothing could be staged) append nothing and return False: what every ``LayerFill.stage`` returns."""
    if parts is None:
        return False
    k_parts.append(parts[0])
    v_parts.append(parts[1])
    return True


def write_rows(out: torch.Tensor, x: torch.Tensor, writer: RowWriter | None, start: int) -> None:
    """``out`` ``[kv_heads, n, head_dim]`` = the in-memory layer tensor ``x`` (same shape, CPU), through ``writer``
    (None: a plain copy)."""
    if writer is None:
        out.copy_(x)
        return
    import torch

    writer(out, x.to(out.dtype).contiguous().view(torch.uint8).numpy(), False, start)

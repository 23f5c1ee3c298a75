"""Query-side LoRA adapters as low-rank terms added by the runner (Hu et al., 2021, arXiv 2106.09685).

The adapters live in the transformers model as peft ``LoraLayer`` s (loaded, trained and removed there,
:mod:`kvlink_rag.model.lora`); the runner reads their A/B tensors by reference, so in-place training updates are
seen, and adds ``scale * (x A^T) B^T`` to the slice of the fused projection each target feeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.families import family_of
from .cpu_kernels import kernels
from .linear import MAX_SMALL_TOKENS, TokenSplit


@dataclass(frozen=True)
class LowRank:
    """One target's term: output columns ``[start, end)`` of its (fused) projection get
    ``scale * (x @ a.T) @ b.T``; ``a`` ``[rank, in]``, ``b`` ``[out, rank]``."""

    start: int
    end: int
    a: torch.Tensor
    b: torch.Tensor
    scale: float


class FusedLowRank:
    """All targets of one adapter inside one fused projection (q|k|v, gate|up) as one pair of GEMMs:
    ``y[:, start:end] += (x A^T) B^T`` with ``A`` the targets' ``a`` stacked ``[sum rank, in]`` and ``B``
    block-diagonal ``[end - start, sum rank]`` with each target's scale folded in (zeros where a column is
    no target's). Two GEMMs per projection instead of two per target: a decode step of the shipped query-side
    adapter runs 8 instead of 14 tiny GEMMs a layer, each ~25 us of call overhead on a CPU thread.

    The stacks are copies, rebuilt when any source tensor changed in place (its ``_version``, e.g. an
    optimizer step of training), so the runner never reads a stale adapter.

    ``gemm_dtype`` bfloat16 (a runner whose prefill linears multiply in bfloat16: ``q4q8-bf16``, ``int4-bf16``,
    ``bfloat16``, see :func:`prefill_gemm_dtype`) runs the GEMMs of :meth:`_gemm` in bfloat16 as the base weights
    do: ``A``, ``B^T`` and ``x A^T`` rounded to bfloat16 (the shipped adapter's ``A`` and ``B`` are bfloat16 values
    already), float32 accumulation in oneDNN. Measured on the AVX512-BF16 EPYC (``docs/bench/lora-bf16-2026-12-06/
    lora_terms_dtype.py``, 30 layers of the shipped adapter, bfloat16 rows): 70 rows 36-38 -> 16 ms, 280 rows
    97-103 -> 30 ms a forward; in the runner, on one request's float32 rows, no faster (``lora_modes.py``). Given the
    projection's ``modules`` too (the runner's terms), prefill rows skip these GEMMs: :meth:`merged` is the
    projection with the adapter merged in (:mod:`.merged_lora`), and only decode rows get their terms
    (:meth:`add_small`). Paired accuracy of both: EVALUATION.md.

    Decode rows in float32 on the CPU take the runner's kernel instead (``lowrank_add``, the loops the fused
    decode halves run, ``csrc/decode_layer.cpp``), on the general path too: a decode row's terms then round the
    same on either path at any thread count. The Q4 x Q8 product after them quantises its input to int8, so
    two summation orders (a GEMM's, which depends on the thread count, and the loops') one ulp apart could
    round an input to different integers and the row's logits apart by a bfloat16 step.
    """

    def __init__(self, terms: list[LowRank], gemm_dtype: torch.dtype | None = None,
                 modules: list[torch.nn.Module] | None = None):
        self.terms, self.gemm_dtype, self.modules = terms, gemm_dtype, modules
        self.start, self.end = min(t.start for t in terms), max(t.end for t in terms)
        self._versions: tuple[int, ...] | None = None
        self.a = self.b_t = self.kernel_a = self.kernel_b_t = self.gemm_a = self.gemm_b_t = None
        self._merged: tuple[tuple[int, ...], object] | None = None  # (versions, Linear) of merged()

    def _build(self) -> None:
        self.a, b = stacked(self.terms, self.start, self.end)  # [sum rank, in], [span, sum rank]
        self.b_t = b.t().contiguous()  # [sum rank, span]
        self.kernel_a, self.kernel_b_t = _narrowed(self.a), _narrowed(self.b_t)
        dtype = self.gemm_dtype or self.a.dtype  # None: the adapter's own dtype
        self.gemm_a, self.gemm_b_t = self.a.to(dtype), self.b_t.to(dtype)

    def kernel_stacks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`stacks` as the kernel (``lowrank_add``) reads them: bfloat16 when every value is one (a shipped
        adapter's weights are stored in bfloat16 and its scale is a power of two: the same values in half the bytes,
        the same sums, since the kernel widens them exactly), else the float32 stacks themselves."""
        self.stacks()
        return self.kernel_a, self.kernel_b_t

    def stacks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``A`` ``[sum rank, in]`` and ``B^T`` ``[sum rank, end - start]`` (scales folded in), rebuilt first
        if a source tensor changed in place."""
        versions = tuple(_version(w) for t in self.terms for w in (t.a, t.b))
        if versions != self._versions:
            self._build()
            self._versions = versions
        return self.a, self.b_t

    def merged(self):
        """The fused projection's weights with this adapter merged in (:mod:`.merged_lora`), a bfloat16
        :class:`~.linear.Linear` for the prefill rows, when the terms multiply in bfloat16 and know their
        projection's ``modules``; else None. Built on first use, rebuilt when a source tensor changed in place."""
        if self.modules is None or self.gemm_dtype != torch.bfloat16:
            return None
        a, b_t = self.stacks()
        if self._merged is None or self._merged[0] != self._versions:
            from .merged_lora import merged_linear

            self._merged = (self._versions, merged_linear(self.modules, self.start, self.end, a, b_t))
        return self._merged[1]

    def add_small(self, y: torch.Tensor, x: torch.Tensor, split: TokenSplit) -> None:
        """:meth:`add_to` for the tokens of ``split.small`` alone (decode rows; the others came through
        :meth:`merged`), as :meth:`add_to` computes them for those rows (the kernel where it fits)."""
        if split.large is None:
            self.add_to(y, x, split)
            return
        rows = split.small
        sub = y[rows]
        self.add_to(sub, x[rows], TokenSplit(torch.arange(rows.numel(), device=rows.device), None))
        y[rows] = sub

    def add_to(self, y: torch.Tensor, x: torch.Tensor, split: TokenSplit | None = None) -> None:
        """``y[:, start:end] += sum over targets of scale * x A^T B^T`` in place (``x`` ``[tokens, in]``).

        The tokens of decode rows (``split.small``; without a split, a call of at most
        :data:`~.linear.MAX_SMALL_TOKENS` tokens) take the kernel where it fits (see the class docstring), the
        others two torch GEMMs, as a :class:`~.linear.SplitLinear` splits its formats."""
        a, b_t = self.kernel_stacks()
        rows = self._kernel_rows(y, x, split)
        if rows is None:
            self._gemm(y, x)
        elif rows is _ALL:
            kernels().lowrank_add(y, x.contiguous(), a, b_t, self.start)
        else:  # a mixed call: every row by GEMM (the others' arithmetic whatever the mix), decode rows redone
            small = y[rows]
            self._gemm(y, x)
            kernels().lowrank_add(small, x[rows].contiguous(), a, b_t, self.start)
            y[rows] = small

    def _kernel_rows(self, y: torch.Tensor, x: torch.Tensor, split: TokenSplit | None):
        """The rows of ``y`` that take ``lowrank_add``: None (no row), ``_ALL`` or an index tensor."""
        if (y.device.type != "cpu" or y.dim() != 2 or y.stride(1) != 1
                or not y.dtype == x.dtype == self.a.dtype == torch.float32 or kernels() is None):
            return None
        if split is None:
            return _ALL if x.shape[0] <= MAX_SMALL_TOKENS else None
        if split.small is None:
            return None
        return _ALL if split.large is None else split.small

    def _gemm(self, y: torch.Tensor, x: torch.Tensor) -> None:
        self.stacks()
        a, b_t = self.gemm_a, self.gemm_b_t
        h = torch.mm(x.to(a.dtype), a.t())  # [tokens, sum rank]
        span = y[:, self.start: self.end]
        if span.dtype == h.dtype:
            span.addmm_(h, b_t)
        else:
            span.add_(torch.mm(h, b_t).to(span.dtype))


_ALL = slice(None)  # FusedLowRank._kernel_rows: every row


def _narrowed(t: torch.Tensor) -> torch.Tensor:
    """``t`` (float32) in bfloat16 when that holds every value exactly, else ``t`` itself."""
    if t.dtype != torch.float32:
        return t
    b = t.to(torch.bfloat16)
    return b if torch.equal(b.float(), t) else t


def _version(t: torch.Tensor) -> int:
    """In-place update counter of ``t`` (inference tensors have none: they change only through a reload,
    which drops the runner's terms)."""
    return 0 if t.is_inference() else t._version


@dataclass
class LayerLora:
    """The terms of one decoder layer, per fused projection (None: no target there)."""

    qkv: FusedLowRank | None = None
    o: FusedLowRank | None = None
    gate_up: FusedLowRank | None = None
    down: FusedLowRank | None = None

    def present(self) -> list[FusedLowRank]:
        """The layer's terms that exist, in projection order (qkv, o, gate_up, down)."""
        return [t for t in (self.qkv, self.o, self.gate_up, self.down) if t is not None]


def _term(module: torch.nn.Module, name: str, start: int) -> LowRank | None:
    from peft.tuners.lora import LoraLayer

    if not isinstance(module, LoraLayer) or name not in module.lora_A:
        return None
    a, b = module.lora_A[name].weight, module.lora_B[name].weight
    return LowRank(start, start + int(b.shape[0]), a, b, float(module.scaling[name]))  # the parameters: versioned


def projection_terms(modules: list[torch.nn.Module], name: str) -> list[LowRank]:
    """Adapter ``name``'s terms in the projection that stacks ``modules`` on its output dim (q, k, v; gate, up; one
    module), each at its module's output rows, its ``a`` and ``b`` the peft parameters themselves (by reference:
    versioned, and differentiable in training); empty where no module is a target."""
    from .weights import base_linear

    out, at = [], 0
    for m in modules:
        t = _term(m, name, at)
        if t is not None:
            out.append(t)
        at += base_linear(m).out_features
    return out


def stacked(terms: list[LowRank], start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``terms`` as one pair: ``A`` ``[sum rank, in]`` (their ``a`` stacked) and ``B`` ``[end - start, sum rank]``
    (each term's ``scale * b`` in its rows and its rank's columns, zeros elsewhere: block-diagonal), so that rows
    ``[start, end)`` of the projection get ``(x A^T) B^T``; a graph is kept where the terms' tensors require grad
    (the training runner's adapted GEMMs, ``training/train_forward.py``)."""
    a = torch.cat([t.a for t in terms], 0)
    b = terms[0].b.new_zeros(end - start, a.shape[0])
    at = 0
    for t in terms:
        r = t.a.shape[0]
        b[t.start - start: t.end - start, at: at + r] = t.b * t.scale
        at += r
    return a, b


def _terms(modules: list[torch.nn.Module], name: str, gemm_dtype: torch.dtype | None) -> FusedLowRank | None:
    out = projection_terms(modules, name)
    return FusedLowRank(out, gemm_dtype, modules) if out else None


def prefill_gemm_dtype(fmt: str) -> torch.dtype | None:
    """bfloat16 where weight format ``fmt`` multiplies prefill rows in bfloat16 (``bfloat16``, ``int4-bf16``,
    ``q4q8-bf16``; ``kvlink_rag.runtime.linear``), else None (the adapter's own dtype, as the model's weights):
    the dtype of the adapter terms' GEMMs (:class:`FusedLowRank`)."""
    return torch.bfloat16 if fmt in ("bfloat16", "int4-bf16", "q4q8-bf16") else None


def adapter_terms(model: torch.nn.Module, name: str, gemm_dtype: torch.dtype | None = None) -> list[LayerLora]:
    """Per decoder layer, the low-rank terms of adapter ``name`` in ``model``, fused per projection (None
    where a projection holds no target), their prefill GEMMs in ``gemm_dtype`` (None: the adapter's own dtype;
    :func:`prefill_gemm_dtype`)."""
    layers, fam = [], family_of(model.config)
    for layer in fam.layers(model):
        p = fam.parts(layer)
        layers.append(LayerLora(qkv=_terms([p.q, p.k, p.v], name, gemm_dtype), o=_terms([p.o], name, gemm_dtype),
                                gate_up=_terms([p.gate, p.up], name, gemm_dtype),
                                down=_terms([p.down], name, gemm_dtype)))
    return layers

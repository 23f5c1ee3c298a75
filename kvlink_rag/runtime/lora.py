"""Query-side LoRA adapters as low-rank terms added by the runner (Hu et al., 2021, arXiv 2106.09685).

The adapters live in the transformers model as peft ``LoraLayer`` s (loaded, trained and removed there,
:mod:`kvlink_rag.model.lora`); the runner reads their A/B tensors by reference, so in-place training updates are
seen, and adds ``scale * (x A^T) B^T`` to the slice of the fused projection each target feeds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..model.families import family_of


@dataclass(frozen=True)
class LowRank:
    """One target's term: output columns ``[start, end)`` of its (fused) projection get
    ``scale * (x @ a.T) @ b.T``; ``a`` ``[rank, in]``, ``b`` ``[out, rank]``."""

    start: int
    end: int
    a: torch.Tensor
    b: torch.Tensor
    scale: float

    def add_to(self, y: torch.Tensor, x: torch.Tensor) -> None:
        """``y[:, start:end] += scale * x A^T B^T`` in place (``x`` ``[tokens, in]``, ``y`` ``[tokens, out]``)."""
        delta = torch.matmul(torch.matmul(x.to(self.a.dtype), self.a.t()), self.b.t())
        y[:, self.start: self.end].add_(delta.to(y.dtype), alpha=self.scale)


@dataclass
class LayerLora:
    """The terms of one decoder layer, per fused projection."""

    qkv: list[LowRank] = field(default_factory=list)
    o: list[LowRank] = field(default_factory=list)
    gate_up: list[LowRank] = field(default_factory=list)
    down: list[LowRank] = field(default_factory=list)


def _term(module: torch.nn.Module, name: str, start: int) -> LowRank | None:
    from peft.tuners.lora import LoraLayer

    if not isinstance(module, LoraLayer) or name not in module.lora_A:
        return None
    a, b = module.lora_A[name].weight, module.lora_B[name].weight
    return LowRank(start, start + int(b.shape[0]), a.detach(), b.detach(), float(module.scaling[name]))


def _terms(modules: list[torch.nn.Module], name: str) -> list[LowRank]:
    from .weights import base_linear

    out, at = [], 0
    for m in modules:
        t = _term(m, name, at)
        if t is not None:
            out.append(t)
        at += base_linear(m).out_features
    return out


def adapter_terms(model: torch.nn.Module, name: str) -> list[LayerLora]:
    """Per decoder layer, the low-rank terms of adapter ``name`` in ``model`` (empty lists where a
    projection is not a target)."""
    layers, fam = [], family_of(model.config)
    for layer in fam.layers(model):
        p = fam.parts(layer)
        layers.append(LayerLora(qkv=_terms([p.q, p.k, p.v], name), o=_terms([p.o], name),
                                gate_up=_terms([p.gate, p.up], name), down=_terms([p.down], name)))
    return layers

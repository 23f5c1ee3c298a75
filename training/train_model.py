"""bfloat16 GEMMs for the training forward, and documents encoded once before training starts.

``bf16`` (where the CPU has native bfloat16: AMX / AVX512-BF16, :func:`kvlink_rag.model.loader.cpu_has_native_bf16`):
the frozen base model's linear layers run their GEMMs in bfloat16 during a training step
(:func:`bf16_gemms`); everything else - the residual stream, norms, attention softmax, LoRA (its trained
weights are the float32 masters the optimiser updates), link embeddings, loss - stays float32. Documents
are encoded outside the block, by the float32 model, so their caches are exactly the ones serving stores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from kvlink_rag.types import Document

if TYPE_CHECKING:
    from kvlink_rag.engine import Engine


class _Bf16Linear:
    """``F.linear`` with a cached bfloat16 copy of a frozen weight: input cast to bfloat16, output back to
    the input's dtype (float32), so only the GEMM runs in bfloat16."""

    def __init__(self, linear: torch.nn.Linear):
        self.weight = linear.weight.detach().to(torch.bfloat16)
        self.bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x.to(torch.bfloat16), self.weight, self.bias).to(x.dtype)


def frozen_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The model's ``nn.Linear`` modules whose weight takes no gradient (the base model's, LoRA's excluded)."""
    return [m for m in model.modules() if type(m) is torch.nn.Linear and not m.weight.requires_grad]


@contextmanager
def bf16_gemms(model: torch.nn.Module, on: bool = True) -> Iterator[None]:
    """Inside the block every frozen linear of ``model`` computes its GEMM in bfloat16 (weights cast once and
    cached on the module); activations, norms, softmax, residual stream, LoRA and the loss stay float32.

    Autocast would do the same GEMMs but re-casts a frozen weight on every call (its cast cache keeps only
    leaves that require grad), which made a step slower than float32. ``on=False``: unchanged.
    """
    if not on:
        yield
        return
    mods = frozen_linears(model)
    for m in mods:
        fast = m.__dict__.get("_bf16_forward")
        if fast is None:  # frozen: cast once per module and process
            fast = m.__dict__["_bf16_forward"] = _Bf16Linear(m)
        m.forward = fast
    try:
        yield
    finally:
        for m in mods:
            m.__dict__.pop("forward", None)


def distinct(docs: Iterable[Document]) -> list[Document]:
    """``docs`` without repeats (same text and title), in order of first use."""
    seen: dict[tuple[str, str | None], Document] = {}
    for d in docs:
        seen.setdefault((d.text, d.title), d)
    return list(seen.values())


def stored_kv_bytes(engine: Engine, docs: Iterable[Document]) -> int:
    """Bytes of K and V the store's records of ``docs`` carry (every chunk, in the engine's stored KV dtype,
    ``kv_dtype``), counted from token ids alone (:func:`store.records.quant.bytes_per_token` a token); record
    framing and LMDB's pages come on top. Raises ValueError: an empty document."""
    from store.records.quant import bytes_per_token

    lm = engine.lm
    kv_heads = int(lm.config.num_key_value_heads or lm.config.num_attention_heads)
    per_token = int(bytes_per_token(lm.num_layers, kv_heads, lm.head_dim, engine.settings.kv_dtype))
    return per_token * sum(int(engine.document_ids(c).numel()) for d in docs for c in engine.chunks(d))


def preencode(warm: Callable[[Document], bool], docs: Iterable[Document]) -> tuple[int, int]:
    """Encode (``warm``: the engine's, which caches) each distinct document of ``docs`` once, before the steps
    that use them; returns ``(documents seen, encoded now)``."""
    unique = distinct(docs)
    return len(unique), sum(0 if warm(d) else 1 for d in unique)

"""The model families the linker reproduces exactly, and their registry.

They differ only where their layouts differ: Qwen2 applies ``sliding_window`` only on the layers its
``layer_types`` mark ``'sliding_attention'``, Qwen3 also normalises queries and keys per head before RoPE;
Llama and Mistral are the default layout (:class:`~kvlink_rag.model.family.ModelFamily`). A new family is a
class in its own file and one instance in :data:`REGISTERED`.

Importing this module does not import torch.
"""

from __future__ import annotations

from typing import Any

from .family import ModelFamily


class LlamaFamily(ModelFamily):
    """Llama (default, linear, llama3 and yarn RoPE scaling) and SmolLM."""

    model_types = ("llama",)


class MistralFamily(LlamaFamily):
    """Mistral: the Llama layout; its ``sliding_window`` applies on every layer."""

    model_types = ("mistral",)


class Qwen2Family(LlamaFamily):
    """Qwen2: the Llama layout (biased q/k/v projections are still ``Linear``); the window applies only on
    layers marked ``'sliding_attention'``."""

    model_types = ("qwen2",)

    def windowed(self, config: Any) -> bool:
        return "sliding_attention" in list(getattr(config, "layer_types", None) or [])


class Qwen3Family(Qwen2Family):
    """Qwen3: Qwen2's window rule plus per-head RMSNorm on queries and keys (``q_norm``, ``k_norm``)."""

    model_types = ("qwen3",)
    qk_norm = True


REGISTERED = (LlamaFamily(), MistralFamily(), Qwen2Family(), Qwen3Family())  # a new family: one instance here
FAMILIES: dict[str, ModelFamily] = {t: fam for fam in REGISTERED for t in fam.model_types}
"""Families by ``config.model_type``."""


def family_of(config: Any) -> ModelFamily:
    """The family of ``config`` (a transformers config, or anything with ``model_type``).

    Raises:
        ValueError: a model type no family serves (the supported ones named).
    """
    model_type = getattr(config, "model_type", None)
    family = FAMILIES.get(model_type)
    if family is None:
        raise ValueError(f"model_type={model_type!r} is not supported; supported: {', '.join(FAMILIES)}")
    return family

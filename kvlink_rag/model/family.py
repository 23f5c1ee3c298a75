"""The model-family adapter: every assumption about how a transformers checkpoint lays out its modules.

The core never walks a model's attributes itself: the decoder stack, a layer's attention and projections,
the rotary module, the final norm, the LM head, the LoRA target names, the attention-kernel switch and
the sliding-window rule all come from the :class:`ModelFamily` of the model's ``config.model_type``
(:func:`kvlink_rag.model.families.family_of`). Adding an architecture is one file with its family class
and one instance in :data:`kvlink_rag.model.families.REGISTERED`.

Importing this module does not import torch.
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class LayerParts:
    """One decoder layer's modules under the family's names.

    Attributes:
        attention: the self-attention module (its forward returns ``(output, weights)`` on the eager kernel).
        q, k, v, o: the attention projections (``torch.nn.Linear`` or a LoRA-wrapped one).
        gate, up, down: the gated MLP's projections.
        input_norm, post_norm: the RMSNorms before attention and before the MLP.
        q_norm, k_norm: per-head RMSNorms on queries and keys before RoPE (Qwen3), else None.
    """

    attention: torch.nn.Module
    q: torch.nn.Module
    k: torch.nn.Module
    v: torch.nn.Module
    o: torch.nn.Module
    gate: torch.nn.Module
    up: torch.nn.Module
    down: torch.nn.Module
    input_norm: torch.nn.Module
    post_norm: torch.nn.Module
    q_norm: torch.nn.Module | None = None
    k_norm: torch.nn.Module | None = None


class ModelFamily(ABC):
    """How one family of ``*ForCausalLM`` checkpoints is laid out. The defaults are the Llama layout
    (``model.model.layers[i].self_attn.{q,k,v,o}_proj``, ``.mlp.{gate,up,down}_proj``,
    ``model.model.rotary_emb``, ``model.model.norm``, ``model.lm_head``); a family overrides what differs.

    Attributes:
        model_types: the ``config.model_type`` values it serves.
        qk_norm: queries and keys pass a per-head RMSNorm before RoPE.
        attention_targets: LoRA target names of the attention projections (the query-side adapter's default).
        mlp_targets: LoRA target names of the MLP projections.
    """

    model_types: ClassVar[tuple[str, ...]] = ()
    qk_norm: ClassVar[bool] = False
    attention_targets: ClassVar[tuple[str, ...]] = ("q_proj", "k_proj", "v_proj", "o_proj")
    mlp_targets: ClassVar[tuple[str, ...]] = ("gate_proj", "up_proj", "down_proj")

    def decoder(self, model: torch.nn.Module) -> torch.nn.Module:
        """The decoder stack without the LM head: called as ``decoder(input_ids=|inputs_embeds=,
        position_ids=, ...)`` it returns hidden states and the KV cache."""
        return model.model

    def layers(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The decoder layers in order."""
        return list(self.decoder(model).layers)

    def parts(self, layer: torch.nn.Module) -> LayerParts:
        """``layer``'s modules (:class:`LayerParts`)."""
        attn, mlp = layer.self_attn, layer.mlp
        return LayerParts(attention=attn, q=attn.q_proj, k=attn.k_proj, v=attn.v_proj, o=attn.o_proj,
                          gate=mlp.gate_proj, up=mlp.up_proj, down=mlp.down_proj,
                          input_norm=layer.input_layernorm, post_norm=layer.post_attention_layernorm,
                          q_norm=attn.q_norm if self.qk_norm else None, k_norm=attn.k_norm if self.qk_norm else None)

    def attention(self, layer: torch.nn.Module) -> torch.nn.Module | None:
        """``layer``'s self-attention module, or None where it has none."""
        import torch

        attn = getattr(layer, "self_attn", None)
        return attn if isinstance(attn, torch.nn.Module) else None

    def rotary_emb(self, model: torch.nn.Module) -> torch.nn.Module | None:
        """The model's own rotary module (called as ``rotary_emb(x, position_ids)``), or None without one."""
        return getattr(getattr(model, "model", None), "rotary_emb", None)

    def final_norm(self, model: torch.nn.Module) -> torch.nn.Module:
        """The RMSNorm after the last layer."""
        return self.decoder(model).norm

    def lm_head(self, model: torch.nn.Module) -> torch.nn.Module:
        """The output projection to the vocabulary."""
        return model.lm_head

    def attention_kernel(self, config: Any) -> str | None:
        """The attention implementation ``config`` runs (``'sdpa'``, ``'eager'``, a registered name)."""
        return getattr(config, "_attn_implementation", None)

    def set_attention_kernel(self, config: Any, name: str) -> None:
        """Switch ``config``'s attention implementation to ``name`` (read by every attention module at each
        call in transformers >= 4.48)."""
        config._attn_implementation = name

    def windowed(self, config: Any) -> bool:
        """Whether ``config.sliding_window`` limits any layer's attention (Llama, Mistral: every layer)."""
        return True

"""A Llama-family model's weights as plain tensors for the runner (Llama, Qwen2/3, Mistral).

Built from the loaded transformers model (which stays the reference and the home of peft adapters).
In the model's own dtype (format ``native``) the fused projections (q|k|v and gate|up) are one tensor each, and the model's own
parameters are re-pointed as row views into them, so nothing is held twice. Other formats
(:data:`~kvlink_rag.runtime.linear.WEIGHT_FORMATS`) hold converted copies beside the model's float32 ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.families import family_of
from .linear import Linear, bfloat16_linear, make_linear

# The LM head of the int4 formats stays exact in bfloat16: the default model's layer weights sit exactly on Q4_1's
# group-32 grid (re-quantised with 0.2% error, from the kernel's bfloat16 scales), but its tied embedding is
# Q8_0 in the GGUF, and int4 adds 9% error there (bfloat16: 0.14%; BENCHMARKS.md, 'Weight formats'); decode
# steps read it as int8 and re-score their best candidates exactly (runtime/head.py).
SHARED_FORMATS = ("native", "int4-f32", "q4q8-f32")  # formats that keep the model's own tensors (fused, re-pointed)


@dataclass
class LayerWeights:
    """One decoder layer.

    Attributes:
        input_norm, post_norm: RMSNorm weights ``[hidden]``.
        qkv: fused projection ``[hidden] -> [(heads + 2 kv_heads) * head_dim]``.
        o: ``[heads * head_dim] -> [hidden]``.
        gate_up: fused ``[hidden] -> [2 * intermediate]``.
        down: ``[intermediate] -> [hidden]``.
        q_norm, k_norm: per-head RMSNorm weights ``[head_dim]`` (Qwen3), else None.
    """

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: Linear
    o: Linear
    gate_up: Linear
    down: Linear
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None


@dataclass
class ModelWeights:
    """All layers, the final norm and the LM head, with the shapes the forward needs.

    Attributes:
        heads, kv_heads, head_dim, intermediate: attention and MLP widths.
        eps: RMSNorm epsilon; fmt: weight format of the linear layers.
    """

    layers: list[LayerWeights]
    norm: torch.Tensor
    lm_head: Linear
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    fmt: str


def base_linear(module: torch.nn.Module) -> torch.nn.Linear:
    """The plain ``nn.Linear`` under ``module`` (a peft LoRA wrapper's base layer, or the module).

    Raises:
        TypeError: neither a Linear nor a peft tuner layer.
    """
    if isinstance(module, torch.nn.Linear):
        return module
    from peft.tuners.tuners_utils import BaseTunerLayer

    if isinstance(module, BaseTunerLayer):
        return base_linear(module.get_base_layer())
    raise TypeError(f"{type(module).__name__} is not a linear layer")


def fused_weight(modules: list[torch.nn.Module]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weights of ``modules`` (linear layers, peft-wrapped or plain) stacked on the output dim, ``[sum out, in]``
    in the modules' dtype, and their biases likewise (zeros for a module without one; None when none has one)."""
    linears = [base_linear(m) for m in modules]
    weight = torch.cat([m.weight.detach() for m in linears])  # [sum out, in]
    bias = None
    if any(m.bias is not None for m in linears):
        bias = torch.cat([m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features)
                          for m in linears])
    return weight, bias


def _fuse(modules: list[torch.nn.Module], fmt: str) -> Linear:
    """One :class:`Linear` for ``modules`` stacked on the output dim; in float32 the modules' weights
    become row views of the fused tensor (format ``native``) (no second copy)."""
    linears = [base_linear(m) for m in modules]
    weight, bias = fused_weight(modules)
    if fmt in SHARED_FORMATS:
        at = 0
        for m in linears:
            n = m.out_features
            m.weight.data = weight[at: at + n]
            if m.bias is not None:
                m.bias.data = bias[at: at + n]
            at += n
    return make_linear(weight, bias, fmt)


def _one(module: torch.nn.Module, fmt: str) -> Linear:
    lin = base_linear(module)
    return make_linear(lin.weight.detach(), None if lin.bias is None else lin.bias.detach(), fmt)


def _head(module: torch.nn.Module, fmt: str) -> Linear:
    """The LM head. ``native``/``bfloat16``/``int8``: the format itself. The int4 formats keep it exact in
    bfloat16 (see the note on top) for prefill rows and read it as int8 with the top candidates re-scored
    exactly for decode rows (:class:`~kvlink_rag.runtime.head.RescoredHead`: 3x less time per decode step's
    head, the same greedy tokens); ``int4-f32`` prefills on the model's own float32 head."""
    if fmt not in ("int4", "int4-bf16", "int4-f32", "q4q8-bf16", "q4q8-f32"):
        return _one(module, fmt)
    from .head import RescoredHead
    from .linear import SplitLinear

    lin = base_linear(module)  # the exact head keeps a plain weight: RescoredHead reads candidate rows of it
    exact = bfloat16_linear(lin.weight, lin.bias, pack=False)
    large = _one(module, "native") if fmt in ("int4-f32", "q4q8-f32") else exact
    approx = None
    if fmt.startswith("q4q8"):
        from .q4q8 import Q8Q8Linear

        approx = Q8Q8Linear(base_linear(module).weight)
    return SplitLinear(RescoredHead(exact, approx=approx), large)


def check_silu_mlp(config) -> None:
    """Raises ValueError unless ``config``'s MLP activation is SiLU (the runners' gated MLP)."""
    act = getattr(config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"hidden_act={act!r} is not supported by the model runner (silu only)")


def model_weights(model: torch.nn.Module, fmt: str = "native") -> ModelWeights:
    """The runner's view of a transformers ``*ForCausalLM`` of the Llama family.

    Args:
        model: LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM / MistralForCausalLM (eval, no grad).
        fmt: weight format of every linear layer (:data:`~kvlink_rag.runtime.linear.WEIGHT_FORMATS`).
    Raises:
        ValueError: an activation other than SiLU, or an unknown format.
    """
    cfg = model.config
    check_silu_mlp(cfg)
    fam = family_of(cfg)
    layers = []
    for layer in fam.layers(model):
        p = fam.parts(layer)
        layers.append(LayerWeights(
            input_norm=p.input_norm.weight.detach(), post_norm=p.post_norm.weight.detach(),
            qkv=_fuse([p.q, p.k, p.v], fmt), o=_one(p.o, fmt), gate_up=_fuse([p.gate, p.up], fmt), down=_one(p.down, fmt),
            q_norm=p.q_norm.weight.detach() if p.q_norm is not None else None,
            k_norm=p.k_norm.weight.detach() if p.k_norm is not None else None))
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    head = _head(fam.lm_head(model), fmt)
    return ModelWeights(layers=layers, norm=fam.final_norm(model).weight.detach(), lm_head=head,
                        heads=int(cfg.num_attention_heads), kv_heads=int(cfg.num_key_value_heads), head_dim=head_dim,
                        intermediate=int(cfg.intermediate_size), eps=float(cfg.rms_norm_eps), fmt=fmt)

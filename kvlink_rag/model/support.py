"""What the linker reproduces exactly, checked before a model is loaded.

Any Hugging Face causal LM of a registered family (:data:`kvlink_rag.model.families.FAMILIES`: Llama incl.
llama3 ``rope_scaling``, Qwen2, Qwen3 with q/k norms, Mistral, SmolLM) with rotate-half RoPE loads. Shapes
the linker does not reproduce (sliding windows, position-dependent or partial RoPE, softcapping, ALiBi,
kernels that ignore the 4-D mask) are refused by :func:`check_supported`, never run wrong.
"""

from __future__ import annotations

from .families import FAMILIES

SUPPORTED_MODEL_TYPES = tuple(FAMILIES)
# RoPE types whose tables depend only on the position (exactness-tested in tests/kvlink_rag/linking/test_linker_exact.py);
# 'dynamic' and 'longrope' rescale with the sequence length, so re-rotated keys would not match.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
SUPPORTED_ATTENTION = ("sdpa", "eager")  # kernels that honour the linker's 4-D additive mask


class ModelLoadError(ValueError):
    """The model path is missing or the architecture is not supported."""


def _rope_parameters(config) -> list[dict]:
    """The RoPE parameter dicts of ``config`` (one, or one per layer type)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if params and all(isinstance(v, dict) for v in params.values()):
        return list(params.values())
    return [params]


def _refusal(config) -> str | None:
    """Why the linker cannot reproduce ``config`` exactly, or None."""
    model_type = getattr(config, "model_type", None)
    family = FAMILIES.get(model_type)
    if family is None:
        return f"model_type={model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
    max_pos = int(config.max_position_embeddings)
    layer_types = list(getattr(config, "layer_types", None) or [])
    odd = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
    if odd:
        return f"layer_types contains {odd}; only full (causal) attention is supported"
    window = getattr(config, "sliding_window", None)
    if window is not None and family.windowed(config) and int(window) < max_pos:
        return (f"sliding_window={window} (< max_position_embeddings={max_pos}) is not supported: the linker "
                "reproduces full causal attention only (a window >= the context, or None, is fine)")
    for rope in _rope_parameters(config):
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            return f"rope_type={rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        factor = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
        if factor is not None and float(factor) != 1.0:
            return f"partial_rotary_factor={factor} is not supported; only full rotate-half RoPE (1.0)"
    for name in ("attn_logit_softcapping", "alibi", "use_alibi", "no_rope_layers", "attention_chunk_size"):
        value = getattr(config, name, None)
        if value:
            return f"{name}={value!r} is not supported by the linker"
    attn = family.attention_kernel(config)
    if attn is not None and attn not in SUPPORTED_ATTENTION:
        return f"attn_implementation={attn!r} is not supported (it ignores the KVLink mask); use sdpa or eager"
    return None


def check_supported(config) -> None:
    """Refuse a config whose attention or positions the linker does not reproduce exactly.

    Supported: model types ``SUPPORTED_MODEL_TYPES`` with full causal attention (no sliding window below
    the context length where the family applies one), rotate-half RoPE over the whole head
    (``partial_rotary_factor`` 1) of a ``SUPPORTED_ROPE_TYPES`` type, no attention softcapping / ALiBi / NoPE
    layers, an sdpa or eager kernel.

    Raises:
        ModelLoadError: naming the field and value and what is supported.
    """
    reason = _refusal(config)
    if reason is not None:
        raise ModelLoadError(f"unsupported model: {reason}")

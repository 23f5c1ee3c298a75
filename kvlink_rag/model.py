"""Model loading and the model fingerprint.

Any Hugging Face causal LM of the Llama family with rotate-half RoPE loads: Llama (incl. llama3
``rope_scaling``), Qwen2, Qwen3 (q/k norms), Mistral, SmolLM. The rotary module and its scaling are
the model's own. Shapes the linker does not reproduce exactly (sliding windows, position-dependent or
partial RoPE, softcapping, ALiBi, kernels that ignore the 4-D mask) are refused by
:func:`check_supported` when the model is loaded, never run wrong.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from .settings import DEFAULT_MODEL, EngineSettings
from .types import parse_dtype

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
# RoPE types whose tables depend only on the position (exactness-tested in tests/kvlink_rag/test_linker_exact.py);
# 'dynamic' and 'longrope' rescale with the sequence length, so re-rotated keys would not match.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
SUPPORTED_ATTENTION = ("sdpa", "eager")  # kernels that honour the linker's 4-D additive mask


class Runner(Protocol):
    """The packed-forward model runner attached to a :class:`LoadedModel` (:mod:`kvlink_rag.runtime`)."""

    def forget_adapters(self) -> None:
        """Drop cached adapter terms (an adapter was added or removed)."""


class ModelLoadError(ValueError):
    """The model path is missing or the architecture is not supported."""


@dataclass
class LoadedModel:
    """A causal LM ready for precompute and linking.

    Attributes:
        model: the transformers ``*ForCausalLM`` (eval mode, no grad).
        tokenizer: its tokenizer (chat template used for framing).
        fingerprint: hex digest identifying config, weights and tokenizer.
        device: where the model runs.
        dtype: compute dtype.
        adapters: names of the query-side LoRA adapters injected into ``model``.
        active_adapter: the adapter :func:`kvlink_rag.lora.adapter_scope` turned on (None: base model).
        weight_format: the runner's weight format (:data:`kvlink_rag.runtime.linear.WEIGHT_FORMATS`).
        runner: the model runner, built on first use (:func:`kvlink_rag.runtime.model_runner.get_runner`).
    """

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    fingerprint: str
    device: torch.device
    dtype: torch.dtype
    adapters: set[str] = field(default_factory=set)
    active_adapter: str | None = None
    weight_format: str = "native"
    runner: Runner | None = field(default=None, repr=False, compare=False)

    @property
    def config(self):
        return self.model.config

    @property
    def rotary_emb(self) -> torch.nn.Module:
        return self.model.model.rotary_emb

    @property
    def embed_tokens(self) -> torch.nn.Module:
        return self.model.get_input_embeddings()

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def head_dim(self) -> int:
        """Per-head width (the config's ``head_dim``, else ``hidden_size / num_attention_heads``)."""
        cfg = self.config
        return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)

    @property
    def max_positions(self) -> int:
        return int(self.config.max_position_embeddings)

    @property
    def kv_dtype(self) -> torch.dtype:
        """dtype of the KV the scheduler's sequences hold (:func:`kv_dtype_of` of the weight format)."""
        return kv_dtype_of(self.weight_format, self.dtype)


BF16_KV_FORMATS = ("bfloat16", "int8", "int4", "int4-bf16")  # formats whose linear layers compute in bfloat16


def kv_dtype_of(weight_format: str, compute_dtype: torch.dtype) -> torch.dtype:
    """The KV dtype of a weight format: bfloat16 for the formats whose GEMMs already round activations to
    bfloat16 (:data:`BF16_KV_FORMATS`; documents are stored in bfloat16 by default, so a linked request's
    documents are copied, not widened), which halves what a decode step's attention reads (vLLM's default
    ``kv_cache_dtype="auto"`` is the model's bfloat16 alike); else the compute dtype (``native`` stays the
    float32 reference of the exactness tests, ``int4-f32`` is for CPUs without native bfloat16)."""
    if compute_dtype == torch.float32 and weight_format in BF16_KV_FORMATS:
        return torch.bfloat16
    return compute_dtype


def resolve_device(name: str) -> torch.device:
    """``'auto'`` picks CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def model_fingerprint(path: Path, config: dict, tokenizer) -> str:
    """sha256 over the config (less library-version and path fields), the weight files' names, sizes,
    tensor headers and first/last MiB of tensor data, and the vocabulary.

    Reading 2 MiB per file keeps this fast for large checkpoints while any fine-tune changes it; two
    conversions of the same GGUF on different machines give the same fingerprint.
    """
    h = hashlib.sha256()
    volatile = ("transformers_version", "_name_or_path", "_model_name_or_path", "dtype", "torch_dtype")
    stable = {k: v for k, v in config.items() if k not in volatile}  # same weights, any library version
    h.update(json.dumps(stable, sort_keys=True, default=str).encode())
    for f in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            start = 0
            if f.suffix == ".safetensors":  # hash the parsed header: its JSON key order is not stable
                n = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(n))
                header.pop("__metadata__", None)
                h.update(json.dumps(header, sort_keys=True).encode())
                start = 8 + n
            fh.seek(start)
            h.update(fh.read(1 << 20))
            fh.seek(max(start, size - (1 << 20)))
            h.update(fh.read(1 << 20))
    vocab = tokenizer.get_vocab()
    h.update(json.dumps(sorted(vocab.items())).encode())
    return h.hexdigest()


def _rope_parameters(config) -> list[dict]:
    """The RoPE parameter dicts of ``config`` (one, or one per layer type)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if params and all(isinstance(v, dict) for v in params.values()):
        return list(params.values())
    return [params]


def _refusal(config) -> str | None:
    """Why the linker cannot reproduce ``config`` exactly, or None."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type={model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
    max_pos = int(config.max_position_embeddings)
    layer_types = list(getattr(config, "layer_types", None) or [])
    odd = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
    if odd:
        return f"layer_types contains {odd}; only full (causal) attention is supported"
    window = getattr(config, "sliding_window", None)
    # Qwen2/Qwen3 apply the window only on layers marked 'sliding_attention'; Mistral on every layer.
    windowed = model_type not in ("qwen2", "qwen3") or "sliding_attention" in layer_types
    if window is not None and windowed and int(window) < max_pos:
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
    attn = getattr(config, "_attn_implementation", None)
    if attn is not None and attn not in SUPPORTED_ATTENTION:
        return f"attn_implementation={attn!r} is not supported (it ignores the KVLink mask); use sdpa or eager"
    return None


def check_supported(config) -> None:
    """Refuse a config whose attention or positions the linker does not reproduce exactly.

    Supported: model types ``SUPPORTED_MODEL_TYPES`` with full causal attention (no sliding window below
    the context length), rotate-half RoPE over the whole head (``partial_rotary_factor`` 1) of a
    ``SUPPORTED_ROPE_TYPES`` type, no attention softcapping / ALiBi / NoPE layers, an sdpa or eager kernel.

    Raises:
        ModelLoadError: naming the field and value and what is supported.
    """
    reason = _refusal(config)
    if reason is not None:
        raise ModelLoadError(f"unsupported model: {reason}")


def wrap_model(model: torch.nn.Module, tokenizer, fingerprint: str) -> LoadedModel:
    """Wrap an already built model (tests build tiny random ones from configs).

    Raises:
        ModelLoadError: the model has no Llama-style rotary module, or see :func:`check_supported`.
    """
    check_supported(model.config)
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "rotary_emb"):
        raise ModelLoadError(
            f"{type(model).__name__} has no Llama-style rotary embedding; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    model.eval().requires_grad_(False)
    p = next(model.parameters())
    return LoadedModel(model=model, tokenizer=tokenizer, fingerprint=fingerprint, device=p.device, dtype=p.dtype)


def load_model(settings: EngineSettings) -> LoadedModel:
    """Load ``settings.model`` (the default alias or a checkpoint folder) on ``settings.device``.

    Raises:
        ModelLoadError: path missing, not a model folder, or unsupported architecture.
        kvlink_rag.convert.ModelFetchError: the default model could not be fetched.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if settings.model == DEFAULT_MODEL:
        from .convert import ensure_default_model

        path = ensure_default_model(settings.models_dir)
    else:
        path = Path(settings.model).expanduser()
    if not (path / "config.json").exists():
        raise ModelLoadError(f"{path} is not a model folder (no config.json)")
    config = AutoConfig.from_pretrained(path)
    check_supported(config)  # before loading any weights
    device = resolve_device(settings.device)
    if settings.compute_dtype == "auto":
        dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    else:
        dtype = parse_dtype(settings.compute_dtype)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(device)
    fp = model_fingerprint(path, config.to_dict(), tokenizer)
    lm = wrap_model(model, tokenizer, fp)
    lm.weight_format = resolve_weight_format(settings.weight_format, device, settings.model == DEFAULT_MODEL)
    return lm


def resolve_weight_format(name: str, device: torch.device, default_model: bool = False) -> str:
    """``'auto'`` -> the format measured best for ``device``. For the default model on a CPU: int4 decode
    steps (its layers are Q4_1 in the GGUF, so int4 re-quantisation lands on the same grid; on the first 300
    dev questions int4-bf16 answers as float32 does, EVALUATION.md 'Weight formats'), with prefill in bfloat16
    (``int4-bf16``) where the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX; measured 1.6x float32
    prefill) and in the model's float32 (``int4-f32``) where it does not (AVX2 only: bfloat16 GEMM is emulated,
    measured 5x slower than float32; BENCHMARKS.md 'Weight formats by CPU'). Other checkpoints: ``native``
    (no such grid: measure before choosing). int8 and int4 are CPU kernels here, so on other devices they fall
    back to ``native``."""
    if name == "auto":
        if not (default_model and device.type == "cpu"):
            return "native"
        return "int4-bf16" if cpu_has_native_bf16() else "int4-f32"
    if name in ("int8", "int4", "int4-bf16", "int4-f32") and device.type != "cpu":
        return "native"
    return name


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (oneDNN's own check: AVX512-BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False

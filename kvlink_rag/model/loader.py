"""Model loading and the model fingerprint.

A causal LM of a registered family loads (:mod:`.families`: Llama incl. llama3 ``rope_scaling``, Qwen2,
Qwen3, Mistral, SmolLM); its layout is read only through its :class:`~kvlink_rag.model.family.ModelFamily`
(:attr:`LoadedModel.family`). The rotary module and its scaling are the model's own. Shapes the linker does
not reproduce exactly are refused by :func:`kvlink_rag.model.support.check_supported` when the model is
loaded, never run wrong.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from ..settings import DEFAULT_MODEL, EngineSettings
from ..types import parse_dtype
from .families import family_of
from .family import ModelFamily
from .support import SUPPORTED_MODEL_TYPES, ModelLoadError, check_supported

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

class Runner(Protocol):
    """The packed-forward model runner attached to a :class:`LoadedModel` (:mod:`kvlink_rag.runtime`)."""

    def forget_adapters(self) -> None:
        """Drop cached adapter terms (an adapter was added or removed)."""


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
        active_adapter: the adapter :func:`kvlink_rag.model.lora.adapter_scope` turned on (None: base model).
        weight_format: the runner's weight format (:data:`kvlink_rag.runtime.linear.WEIGHT_FORMATS`).
        kv_cache_dtype: the setting of the scheduler's KV dtype (:func:`kv_dtype_of`; ``'auto'`` by default).
        runner: the model runner, built on first use (:func:`kvlink_rag.runtime.model_runner.get_runner`).
        kv_pool: the KV block pool of the scheduler's sequences, made on first use
            (:func:`kvlink_rag.runtime.block_pool.kv_pool`).
        scratch_pool: the one-request paths' KV pool, one arena as long as the longest sequence so far, reused
            so that their writes land in touched pages (:func:`kvlink_rag.runtime.kv_sequence.pooled_sequence`).
    """

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    fingerprint: str
    device: torch.device
    dtype: torch.dtype
    adapters: set[str] = field(default_factory=set)
    active_adapter: str | None = None
    weight_format: str = "native"
    kv_cache_dtype: str = "auto"
    runner: Runner | None = field(default=None, repr=False, compare=False)
    kv_pool: object | None = field(default=None, repr=False, compare=False)
    scratch_pool: object | None = field(default=None, repr=False, compare=False)

    @property
    def config(self):
        return self.model.config

    @property
    def family(self) -> ModelFamily:
        """The model's layout adapter (:func:`kvlink_rag.model.families.family_of` its config)."""
        return family_of(self.config)

    @property
    def decoder(self) -> torch.nn.Module:
        """The decoder stack without the LM head (:meth:`ModelFamily.decoder`): hidden states and KV."""
        return self.family.decoder(self.model)

    @property
    def rotary_emb(self) -> torch.nn.Module:
        return self.family.rotary_emb(self.model)

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
        return kv_dtype_of(self.weight_format, self.dtype, self.kv_cache_dtype)


BF16_KV_FORMATS = ("bfloat16", "int8", "int4", "int4-bf16", "q4q8-bf16")  # formats whose linear layers compute in bfloat16
KV_CACHE_DTYPES = ("float32", "bfloat16")  # kv_cache_dtype choices besides 'auto'


def kv_dtype_of(weight_format: str, compute_dtype: torch.dtype, kv_cache_dtype: str = "auto") -> torch.dtype:
    """The KV dtype of the scheduler's sequences. ``kv_cache_dtype`` (the setting, vLLM's name) ``'float32'`` or
    ``'bfloat16'`` chooses it; ``'auto'``: bfloat16 for the formats whose GEMMs already round activations to
    bfloat16 (:data:`BF16_KV_FORMATS`; documents are stored in bfloat16 by default, so a linked request's
    documents are copied, not widened), which halves what a decode step's attention reads (vLLM's default
    ``kv_cache_dtype="auto"`` is the model's bfloat16 alike); else the compute dtype (``native`` stays the
    float32 reference of the exactness tests; ``int4-f32`` / ``q4q8-f32`` are for CPUs without native bfloat16,
    where ``'bfloat16'`` serves 10-24% more requests a second at -0.3 points of full-prefill accuracy against
    float32 KV on 300 questions: opt-in, BENCHMARKS.md / EVALUATION.md; their float32 prefill queries then attend
    over the KV widened to float32, :func:`kvlink_rag.runtime.ragged.attend`).

    Raises:
        ValueError: an unknown ``kv_cache_dtype``.
    """
    if kv_cache_dtype != "auto":
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be auto, float32 or bfloat16, not {kv_cache_dtype!r}")
        return parse_dtype(kv_cache_dtype)
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


def wrap_model(model: torch.nn.Module, tokenizer, fingerprint: str) -> LoadedModel:
    """Wrap an already built model (tests build tiny random ones from configs).

    Raises:
        ModelLoadError: the model has no Llama-style rotary module, or see :func:`check_supported`.
    """
    check_supported(model.config)
    if family_of(model.config).rotary_emb(model) is None:
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
        kvlink_rag.model.convert.ModelFetchError: the default model could not be fetched.
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
    lm.kv_cache_dtype = settings.kv_cache_dtype
    from ..runtime.prefill_attention import set_mode

    set_mode(settings.prefill_attention)  # process-wide, as the kernels themselves are
    return lm


def resolve_weight_format(name: str, device: torch.device, default_model: bool = False) -> str:
    """``'auto'`` -> the format measured best for ``device``. For the default model on a CPU: int4 decode
    steps (its layers are Q4_1 in the GGUF, so int4 re-quantisation lands on the same grid; on the first 300
    dev questions int4-bf16 answers as float32 does, EVALUATION.md 'Weight formats'), with prefill in bfloat16
    (``int4-bf16``) where the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX; measured 1.6x float32
    prefill) and in the model's float32 (``int4-f32``) where it does not (AVX2 only: bfloat16 GEMM is emulated,
    measured 5x slower than float32; BENCHMARKS.md 'Weight formats by CPU'). Where the runner's CPU kernels run
    (AVX2 or AVX512-VNNI, and g++, :mod:`kvlink_rag.runtime.cpu_kernels`) decode steps take the Q4 x Q8 kernel
    (``q4q8-bf16`` / ``q4q8-f32``: 1.6-2x the decode speed of torch's int4 kernel, accuracy within the 1-point
    rule on 300 questions, EVALUATION.md), each decode step's layers as two fused C++ halves over a float32
    residual stream in both (:mod:`kvlink_rag.runtime.fused_decode`). Other checkpoints: ``native``
    (no such grid: measure before choosing). int8 and int4 are CPU kernels here, so on other devices they fall
    back to ``native``.

    Raises:
        ValueError: a ``q4q8`` format on a CPU where its kernel cannot run (neither AVX2 nor AVX512-VNNI, or no compiler).
    """
    if name == "auto":
        if not (default_model and device.type == "cpu"):
            return "native"
        from ..runtime import q4q8

        family = "q4q8" if q4q8.available() else "int4"
        return f"{family}-bf16" if cpu_has_native_bf16() else f"{family}-f32"
    if name in ("int8", "int4", "int4-bf16", "int4-f32", "q4q8-bf16", "q4q8-f32") and device.type != "cpu":
        return "native"
    if name.startswith("q4q8"):
        from ..runtime import q4q8

        if not q4q8.available():
            raise ValueError(f"weight format {name!r} needs a CPU with AVX2 (or AVX512-VNNI) and a C++ compiler (g++) to "
                             "build its kernel; choose int4-bf16 or int4-f32")
    return name


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware: AVX512-BF16 or AMX-BF16 among its flags
    (:func:`~kvlink_rag.runtime.cpu_kernels.cpu_flags`). oneDNN's ``_is_mkldnn_bf16_supported`` is not the test:
    it is true on any AVX512 core (Ice Lake, Cascade Lake), where oneDNN emulates bfloat16 (its GEMM measured
    3.3-3.7x slower than float32 on an Ice Lake Xeon, BENCHMARKS.md 2026-12-07b). Where no flags can be read: oneDNN's check."""
    from ..runtime.cpu_kernels import cpu_flags

    flags = cpu_flags()
    if flags:
        return bool(flags & {"avx512_bf16", "amx_bf16"})
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False

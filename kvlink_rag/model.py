"""Model loading and the model fingerprint.

Any Hugging Face causal LM of the Llama family with rotate-half RoPE loads: Llama (incl. llama3
``rope_scaling``), Qwen2, Qwen3 (q/k norms), Mistral, SmolLM. The rotary module and its scaling are
the model's own.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .settings import DEFAULT_MODEL, Settings
from .types import parse_dtype

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


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
    """

    model: torch.nn.Module
    tokenizer: object
    fingerprint: str
    device: torch.device
    dtype: torch.dtype
    adapters: set[str] = field(default_factory=set)

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
    def max_positions(self) -> int:
        return int(self.config.max_position_embeddings)


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
        ModelLoadError: the model has no Llama-style rotary module.
    """
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "rotary_emb"):
        raise ModelLoadError(
            f"{type(model).__name__} has no Llama-style rotary embedding; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    model.eval().requires_grad_(False)
    p = next(model.parameters())
    return LoadedModel(model=model, tokenizer=tokenizer, fingerprint=fingerprint, device=p.device, dtype=p.dtype)


def load_model(settings: Settings) -> LoadedModel:
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
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(
            f"model type {config.model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    device = resolve_device(settings.device)
    if settings.compute_dtype == "auto":
        dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    else:
        dtype = parse_dtype(settings.compute_dtype)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(device)
    fp = model_fingerprint(path, config.to_dict(), tokenizer)
    return wrap_model(model, tokenizer, fp)

"""Factories for tests: tiny random models built from configs for every supported family."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from kvlink_rag.engine import Engine
from kvlink_rag.model.loader import LoadedModel, load_model, wrap_model
from service.settings import Settings, get_settings
from kvlink_rag.types import DocumentKV

# the tiny text engine's device: cpu here; the GPU script (scripts/device_check.sh) sets cuda
TEST_DEVICE = os.environ.get("KVLINK_RAG_TEST_ENGINE_DEVICE", "cpu")
VOCAB = 256


def tiny_config(family: str, head_dim: int = 64, **overrides):
    """A 2-layer config with GQA (4 query heads, 2 KV heads) for ``family``.

    families: llama, llama3 (llama3 rope_scaling), qwen2, qwen3 (q/k norm), mistral, llama-yarn,
    llama-linear (linear RoPE scaling).
    """
    common = dict(vocab_size=VOCAB, hidden_size=4 * head_dim, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=2048,
                  tie_word_embeddings=False, attn_implementation="sdpa")
    common.update(overrides)
    if family == "llama":
        return LlamaConfig(**common)
    if family == "llama3":
        return LlamaConfig(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 256}, **common)
    if family == "llama-linear":
        return LlamaConfig(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, **common)
    if family == "llama-yarn":
        return LlamaConfig(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                            "original_max_position_embeddings": 512}, **common)
    if family == "qwen2":
        return Qwen2Config(**common)
    if family == "qwen3":
        return Qwen3Config(**common)
    if family == "mistral":
        return MistralConfig(**{"sliding_window": None, **common})
    raise ValueError(family)


def tiny_model(family: str = "llama", head_dim: int = 64, seed: int = 0, **overrides) -> LoadedModel:
    """A random tiny float32 model on CPU (no tokenizer: exactness tests work on ids)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, head_dim, **overrides), dtype=torch.float32)
    return wrap_model(model, tokenizer=None, fingerprint=f"tiny-{family}-{head_dim}-{seed}")


def random_ids(n: int, seed: int) -> torch.Tensor:
    """``[n]`` int64 random ids in the tiny vocabulary."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (n,), generator=g)


@functools.lru_cache(maxsize=1)
def default_model_path() -> Path:
    """The converted default model (fetched and converted on first use; ``make test`` does it up front)."""
    from kvlink_rag.model.convert import ensure_default_model

    return ensure_default_model(get_settings().models_dir)


@functools.lru_cache(maxsize=1)
def real_lm() -> LoadedModel:
    """The default model, loaded once per test session (float32, CPU)."""
    return load_model(Settings(model=str(default_model_path()), device="cpu"))


def real_engine(home: Path, cache=None, **overrides) -> Engine:
    """An engine over the shared real model with its state under ``home``."""
    settings = Settings(home=home, model=str(default_model_path()), device="cpu", **overrides)
    return Engine(settings, lm=real_lm(), cache=cache)


NQ_PATH = Path(os.environ.get("KVLINK_RAG_NQ_PATH")
               or Path(__file__).resolve().parents[1].parent / "shared" / "data" / "nq-open-oracle-dev.jsonl.gz")
"""The NQ data: ``$KVLINK_RAG_NQ_PATH``, else ``../shared/data`` beside the checkout; tests that need it skip
without it."""


@functools.lru_cache(maxsize=1)
def real_tokenizer():
    """The default model's tokenizer (for tiny models that need real text framing)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path())


def tiny_text_engine(home: Path, seed: int = 0, max_positions: int = 2048, layers: int = 2, **overrides) -> Engine:
    """An engine over a tiny random Llama (head_dim 16, ``max_positions`` context, ``layers`` layers) with
    the real tokenizer: fast training tests. On ``KVLINK_RAG_TEST_ENGINE_DEVICE`` (default ``cpu``; the GPU
    script runs the scheduler tests with ``cuda``)."""
    tok = real_tokenizer()
    torch.manual_seed(seed)
    config = tiny_config("llama", head_dim=16, vocab_size=len(tok), num_hidden_layers=layers,
                         max_position_embeddings=max_positions)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(TEST_DEVICE)
    lm = wrap_model(model, tokenizer=tok, fingerprint=f"tiny-text-{seed}")
    return Engine(Settings(home=home, model="unused", device=TEST_DEVICE, **overrides), lm=lm)


def save_adapter(engine: Engine, links_dir: Path, name: str, k: int = 3, seed: int = 0,
                 fingerprint: str | None = None) -> Path:
    """A random link-token artifact with a LoRA (non-zero B, so it changes the output) saved as ``name``."""
    from kvlink_rag.adapter_registry import adapter_path
    from kvlink_rag.linking.link_tokens import LinkTokens
    from kvlink_rag.model.lora import DEFAULT_TARGETS, add_lora, lora_state, remove_lora

    torch.manual_seed(seed)
    scratch = f"scratch{seed}"
    add_lora(engine.lm, scratch, rank=4, alpha=8)  # only for the weight names and shapes
    lora = {n: torch.randn_like(w) * 0.05 for n, w in lora_state(engine.lm, scratch).items()}
    remove_lora(engine.lm, scratch)
    art = LinkTokens(torch.randn(k, engine.lm.config.hidden_size), fingerprint or engine.lm.fingerprint,
                     {"trained": True}, lora=lora, lora_config={"rank": 4, "alpha": 8, "targets": list(DEFAULT_TARGETS)})
    path = adapter_path(links_dir, name)
    art.save(path, lora_dtype=torch.float32)
    return path


def random_kv(
    layers: int = 3,
    heads: int = 2,
    tokens: int = 16,
    dim: int = 8,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    fingerprint: str = "fp-test",
    encoding: str = "anchored",
) -> DocumentKV:
    """A small random document: keys/values ``[layers, heads, tokens, dim]`` N(0, 1) in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    shape = (layers, heads, tokens, dim)
    return DocumentKV(
        keys=torch.randn(shape, generator=g).to(dtype),
        values=torch.randn(shape, generator=g).to(dtype),
        token_ids=torch.randint(0, 50_000, (tokens,), generator=g, dtype=torch.int64),
        fingerprint=fingerprint,
        encoding=encoding,
    )


def randomise_lora(lm: LoadedModel, name: str, seed: int = 0) -> None:
    """Fill adapter ``name`` 's LoRA A and B with small random values (a fresh adapter's B = 0 changes nothing)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in lm.model.named_parameters():
            if f".{name}." in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def corrupt_layer(lmdb_env, key: str, layer: int) -> None:
    """Flip one payload byte of layer ``layer`` of the LMDB record ``key`` (its checksum then fails)."""
    db = lmdb_env.db(b"blobs")
    name = f"{key}/L{layer}".encode()

    def flip(txn):
        buf = bytearray(txn.get(name, db=db))
        buf[-3] ^= 0xFF
        txn.put(name, bytes(buf), db=db)

    lmdb_env.write(flip)

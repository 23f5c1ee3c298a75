"""The service's settings (HTTP, API keys and limits, retrieval, precompute queue and Celery, the
scheduler, the router fleet, pins) and a process's whole configuration, :class:`Settings`: the engine's,
the store's and the service's classes in one, read from the same ``KVLINK_RAG_*`` environment variables."""

from __future__ import annotations

from pydantic import Field, field_validator

from kvlink_rag.home import LayerSettings, registered
from kvlink_rag.runtime.policies import POLICIES
from kvlink_rag.settings import SERVED_MODEL_ID, EngineSettings  # noqa: F401 - re-exported for the API
from store.settings import StoreSettings


class ServiceSettings(LayerSettings):
    """Service settings (api/, workers/, service/): every field can be set with ``KVLINK_RAG_<FIELD>``."""

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
    admission_policy: str = Field(
        "buckets", description="Order of admission: 'buckets' (starved first, then the oldest request's S/M/L "
        "length bucket), 'cache-aware' (starved first, then most documents in common with running requests), "
        "'fair' (per-tenant virtual token counters: the least served tenant first, then its starved requests, "
        "bucket and warm documents) or 'fifo' (arrival order); any name registered in "
        "kvlink_rag/runtime/policies.py POLICIES.")
    max_step_tokens: int = Field(256, ge=16, description="Tokens one scheduler step computes: every decode token, "
                                 "then chunks of prefills (chunked prefill), so a long prefill never stalls the rest.")
    long_prefill_budget: int = Field(
        0, ge=0, description="Token-equivalents a long prefill (more than max_step_tokens) computes per step (its "
        "tokens weighted by their attention over the keys before them; vLLM's long_prefill_token_threshold); 0 = no "
        "cap beyond max_step_tokens: its steps yield between layers to new queries and the others' decode steps.")
    max_queue_wait_s: float = Field(2.0, gt=0, description="A request waiting longer is admitted before any other.")
    prefix_cache_bytes: int = Field(512 * 2**20, ge=0, description="Bytes of shared prompt-prefix KV (the prefix "
                                    "tree: system prompt, documents in order, earlier chat turns); 0 = no sharing.")
    kv_pool_bytes: int = Field(0, ge=0, description="Bytes of the KV block pool that running requests' KV and "
                               "the prefix tree live in; 0 = grows as needed. Full: the tree evicts, then a request "
                               "that does not fit waits for running ones (alone: 503).")
    kv_block_size: int = Field(16, ge=1, le=4096, description="Tokens per KV block (the pool's unit of sharing).")
    kv_pool_idle_s: float = Field(30.0, ge=0, description="Seconds an empty arena of the KV pool (256 blocks) is "
                                  "kept for the next requests before its memory is given back (the first arena and "
                                  "one spare always stay); 0 = at once.")
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

    @field_validator("admission_policy")
    @classmethod
    def _registered_policy(cls, name: str) -> str:
        """Refuse an admission policy that is not registered in :data:`kvlink_rag.runtime.policies.POLICIES`."""
        return registered("admission policy", name, sorted(POLICIES))

    @property
    def distributed(self) -> bool:
        """Precompute runs on Celery workers (a broker is configured) rather than in the server."""
        return bool(self.broker_url)


class Settings(EngineSettings, StoreSettings, ServiceSettings):
    """A process's whole configuration: the engine's, the store's and the service's fields (the service
    hands each layer its part; each layer's code reads only its own class's fields).

    Every field can be set with an environment variable ``KVLINK_RAG_<FIELD>`` or in
    ``$KVLINK_RAG_HOME/settings.env`` (:func:`get_settings`).
    """


def get_settings(**overrides) -> Settings:
    """Settings from the environment and ``$KVLINK_RAG_HOME/settings.env``, then ``overrides``."""
    base = Settings(**overrides)
    env_file = base.home / "settings.env"
    if env_file.exists():
        return Settings(_env_file=env_file, **overrides)
    return base

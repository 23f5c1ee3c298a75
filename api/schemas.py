"""Query, chat and completion request and response bodies (pydantic; documents: :mod:`api.document_schemas`). Limits that depend on settings are checked in the routes; request
bodies are strict and encodable (:class:`api.request_body.RequestBody`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from api.contract import NON_BLANK, every, forbidden, limit, refused
from api.document_schemas import DocId
from api.generation_fields import GenerationFields, OpenAIFields
from api.output_fields import ChatOutputFields
from api.request_body import RequestBody

SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed takes 0..2^64-1
MAX_NEW_TOKENS_CAP = 1 << 20  # the configured KVLINK_RAG_MAX_NEW_TOKENS_LIMIT is checked in QueryService.plan
MAX_CHAT_MESSAGES = 1024
MAX_IDS_PER_QUERY = 10_000  # the configured KVLINK_RAG_MAX_QUERY_DOCUMENTS is checked in QueryService.plan
CHAT_ROLES = ("system", "user", "assistant")  # kvlink_rag.text.conversation.ROLES (not imported: it needs torch)


IDS_AND_TOP_K = {"document_ids": {"type": "array"}, "top_k": {"type": "integer"}}  # "give either ..., not both"
BLEND = {"recompute_ratio": {"type": "number", "exclusiveMinimum": 0}}  # recompute_ratio > 0 is linked-only, no explain
FULL = {"mode": {"const": "full"}}  # the full-prefill comparison takes no explain, no retention below 1
# an attribution method names how explain attributes: refused without explain: true
ATTRIBUTION_ALONE = {"required": ["attribution"],
                     "properties": {"attribution": {"type": "string"}, "explain": {"not": {"const": True}}}}
TOP_LOGPROBS_ALONE = {"required": ["top_logprobs"],  # top_logprobs >= 1 needs logprobs: true
                      "properties": {"top_logprobs": {"type": "integer", "minimum": 1}, "logprobs": {"not": {"const": True}}}}
# -- queries -----------------------------------------------------------------------------------------


MaxNewTokens = Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS_CAP, description="At most "
                                    "KVLINK_RAG_MAX_NEW_TOKENS_LIMIT (checked when the query is planned).",
                                    json_schema_extra=limit(maximum="max_new_tokens_limit"))]
Temperature = Annotated[float, Field(ge=0.0, le=5.0, allow_inf_nan=False, description="0..5; 0 and anything "
                                     "below 1e-5 decode greedily (as vLLM: a smaller one overflows float32 logits).")]
TopP = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False, description="Nucleus mass (0, 1]; the most "
                              "likely token is always kept, so a tiny top_p samples it alone.")]
Seed = Annotated[int, Field(ge=0, le=SEED_MAX, json_schema_extra=limit(maximum="seed_max"), description="Sampling seed, 0..2^64-1: the same seed and request "
                            "give the same answer; without one sampling (temperature >= 1e-5) is "
                            "nondeterministic, as in OpenAI's API and vLLM. Greedy answers never depend on it.")]
TopK = Annotated[int, Field(ge=1, description="At most KVLINK_RAG_MAX_TOP_K (checked when the query is planned).",
                            json_schema_extra=limit(maximum="max_top_k"))]
LinkK = Annotated[int, Field(ge=0, le=1024, description="Link tokens per document (0 = naive reuse); at most the "
                             "loaded K (checked when the query is planned).", json_schema_extra=limit(maximum="link_k"))]
DocIds = Annotated[list[DocId], Field(max_length=MAX_IDS_PER_QUERY, description="At most "
                                      "KVLINK_RAG_MAX_QUERY_DOCUMENTS distinct ids (checked when planned).",
                                      json_schema_extra={"minItems": 1, **limit(maxItems="max_query_documents")})]


Retention = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False, description="Fraction of each document's cached tokens kept "
                                   "(0 < r <= 1; default KVLINK_RAG_RETENTION): the most important ones, at their "
                                   "original positions. Linked answers only.")]
RecomputeRatio = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False, description="CacheBlend: fraction of "
                                        "document tokens (0..1; default KVLINK_RAG_RECOMPUTE_RATIO, 0 = off) "
                                        "recomputed in the joined context, those whose reused KV deviates most. "
                                        "Linked answers only, not with explain; answered one at a time.")]
MinRelativeScore = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False, description="Retrieved documents are kept "
                                         "only with a BM25 score of at least this fraction of the best one's "
                                         "(default KVLINK_RAG_RETRIEVAL_MIN_RELATIVE_SCORE; 0 keeps the whole top_k).")]
MinScore = Annotated[float, Field(ge=0, allow_inf_nan=False, description="Retrieved documents are kept only with a BM25 "
                                  "score of at least this (default KVLINK_RAG_RETRIEVAL_MIN_SCORE).")]
Explain = Annotated[bool, Field(description="Also return each document's share of the question and answer "
                                "tokens' attention (documents[].attribution) and its top passages (character "
                                "offsets). Linked answers only; costs the eager attention kernel.")]
AttributionField = Annotated[Literal["leave_one_out", "attention"], Field(
    description="With explain: how documents are attributed (default KVLINK_RAG_ATTRIBUTION): leave_one_out (one "
    "more link forward per document, no document re-encoded) or attention (the attention shares only).")]


class Passage(BaseModel):
    start: int = Field(..., description="First character (into the document's text as normalised: NFC, LF).")
    end: int = Field(..., description="One past the last character.")
    share: float = Field(..., description="Share of the document's attention mass in this span.")


class Sampling(GenerationFields):
    max_new_tokens: MaxNewTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None

    def sampling(self) -> dict:
        """Keywords of ``QueryService.plan``: the sampling fields, ``stop``, ``ignore_eos``, ``min_tokens``."""
        return dict(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                    seed=self.seed, **self.generation())


AdapterName = Annotated[str, Field(max_length=64, description="'default' (the loaded link tokens and query-side "
                                   "adapter), 'none' (adapter off), a bundled adapter ('lookup': exact lookups such as "
                                   "key-value retrieval) or the name of an artifact in $KVLINK_RAG_HOME/links "
                                   "(GET /v1/adapters).")]


class QueryIn(Sampling):
    """A question over named documents (``document_ids``) or the ``top_k`` best BM25 matches.

    Every field is range-checked here (422 ``invalid_request`` naming the field); limits that depend on
    settings (question length, top_k, max_new_tokens, number of ids, k) are checked by ``QueryService.plan``.
    """

    model_config = ConfigDict(json_schema_extra=every(forbidden(
        IDS_AND_TOP_K, {**BLEND, **FULL}, {**BLEND, "explain": {"const": True}}, {**FULL, "explain": {"const": True}},
        {**FULL, "retention": {"type": "number", "exclusiveMaximum": 1}}), refused(ATTRIBUTION_ALONE)))

    question: str = Field(..., min_length=1, description="At most KVLINK_RAG_MAX_QUESTION_CHARS characters.",
                          json_schema_extra={"pattern": NON_BLANK, **limit(maxLength="max_question_chars")})
    document_ids: DocIds | None = None
    top_k: TopK | None = None
    stream: bool = False
    k: LinkK | None = None
    adapter: AdapterName | None = None
    mode: Literal["linked", "full"] = Field("linked", description="'linked' (cached document KV re-linked) or "
                                            "'full' (full prefill of the same prompt, for comparison: cold, no cache "
                                            "or prefix tree used, cached_tokens 0, every cache_hit false, "
                                            "cache_load_s 0, link_s the prefill time).")
    retention: Retention | None = None
    explain: Explain = False
    attribution: AttributionField | None = None
    recompute_ratio: RecomputeRatio | None = None
    min_relative_score: MinRelativeScore | None = None
    min_score: MinScore | None = None


class UsedDocument(BaseModel):
    id: str
    title: str
    version: int
    content_hash: str
    cache_hit: bool = Field(..., description="True: KV came from the cache; False: encoded for this query.")
    score: float | None = Field(None, description="BM25 score when retrieved.")
    chunk: int | None = Field(None, description="A retrieved chunk of a document stored as chunks: its index "
                              "(only that chunk was linked); None: the whole document.")
    attribution: float | None = Field(None, description="With explain: this document's share (0..1) by the request's "
                                      "attribution method: of the answer log-likelihood lost when each document "
                                      "is left out (leave_one_out), or of the attention question and answer "
                                      "tokens paid to the prefix and the documents (attention).")
    log_likelihood_drop: float | None = Field(None, description="With explain and attribution leave_one_out: "
                                              "log p(answer | all) - log p(answer | all but this one), nats.")
    passages: list[Passage] | None = Field(None, description="With explain: the most-attended spans, most first.")


class Timings(BaseModel):
    """Seconds from the request's start: retrieval (incl. reading the texts), waiting for the model,
    loading cached KV (and encoding misses), linking (RoPE + link/question forward), first token, total."""

    retrieval_s: float
    queue_wait_s: float
    cache_load_s: float
    link_s: float
    ttft_s: float
    total_s: float


class QueryOut(BaseModel):
    answer: str
    documents: list[UsedDocument]
    timings: Timings
    context_tokens: int
    completion_tokens: int
    cached_tokens: int = Field(0, description="Prompt tokens not computed for this query: the prefix tree (also "
                               "in mode 'full' only with KVLINK_RAG_FULL_MODE_CACHED: an earlier full request's KV), the "
                               "prefix KV, stored document caches; 0 in mode 'full'.")
    token_sources: dict[str, int] = Field(default_factory=dict, description="Prompt tokens by source (scheduler "
                                          "path): document_cache_tokens (stored caches; shared_tier_tokens of them "
                                          "fetched from the shared tier), encoded_tokens (encoded now), "
                                          "prefix_tree_tokens.")
    finish_reason: Literal["stop", "length"]
    prefix_attribution: float | None = Field(None, description="With explain: the system prompt's attention share.")
    attribution_method: Literal["leave_one_out", "attention"] | None = Field(
        None, description="With explain: the method behind documents[].attribution.")


# -- OpenAI-compatible chat --------------------------------------------------------------------------


class ContentPart(RequestBody):
    """One part of a message's ``content`` list; only ``text`` parts are read (others, images, are ignored)."""

    model_config = ConfigDict(strict=True, extra="allow")
    type: str = Field(..., max_length=64)
    text: str | None = None


class ChatMessage(RequestBody):
    """One message; the server checks the conversation's order (:func:`kvlink_rag.text.conversation.check_turns`:
    after system messages user and assistant alternate, starting and ending with a non-empty user message),
    which a JSON schema cannot express."""

    model_config = ConfigDict(strict=True, extra="allow")
    role: str = Field(..., max_length=64, json_schema_extra={"enum": list(CHAT_ROLES)})
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        """The text of the message (text parts joined)."""
        if isinstance(self.content, list):
            return "".join(p.text or "" for p in self.content if p.type == "text")
        return self.content or ""


class StreamOptions(RequestBody):
    include_usage: bool = Field(False, description="A last chunk with empty choices carries the usage.")
    continuous_usage_stats: bool = Field(False, description="vLLM's option, accepted for its clients (guidellm sends "
                                         "it): the usage still comes on the last chunk only.")


class ChatIn(ChatOutputFields, OpenAIFields):
    """``/v1/chat/completions``: the last user message is the question; documents by ``document_ids``
    or ``top_k`` (extra fields, e.g. the openai client's ``extra_body``). OpenAI fields the service does not
    implement (``tools``, ``logit_bias``, penalties...) are refused with a 422
    naming the field (:mod:`api.generation_fields`); other unknown fields are ignored with a warning."""

    model_config = ConfigDict(strict=True, extra="allow",
                              json_schema_extra=every(forbidden(IDS_AND_TOP_K, {**BLEND, "explain": {"const": True}}),
                                                       refused(ATTRIBUTION_ALONE, TOP_LOGPROBS_ALONE)))
    model: str | None = Field(None, max_length=200)
    messages: list[ChatMessage] = Field(..., min_length=1, max_length=MAX_CHAT_MESSAGES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: MaxNewTokens | None = None
    max_completion_tokens: MaxNewTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    n: int | None = Field(None, ge=1, description="Choices (at most KVLINK_RAG_MAX_CHOICES); choice i samples "
                          "with seed + i; they share the prompt's KV through the prefix tree.",
                          json_schema_extra=limit(maximum="max_choices"))
    document_ids: DocIds | None = None
    top_k: TopK | None = None
    k: LinkK | None = None
    adapter: AdapterName | None = Field(None, description="As /v1/query's; without it, a ``model`` naming an adapter "
                                        "(GET /v1/models lists them, vLLM's LoRA convention) picks that adapter.")
    retention: Retention | None = None
    explain: Explain = False
    attribution: AttributionField | None = None
    recompute_ratio: RecomputeRatio | None = None
    min_relative_score: MinRelativeScore | None = None
    min_score: MinScore | None = None

    def sampling(self) -> dict:
        """Keywords of ``QueryService.plan_chat``: sampling, ``stop``, ``ignore_eos``, ``min_tokens``."""
        return dict(max_new_tokens=self.max_completion_tokens or self.max_tokens, temperature=self.temperature,
                    top_p=self.top_p, seed=self.seed, **self.generation())

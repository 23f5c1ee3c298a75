"""A query's plan and result, and the checks a front end can run before the model loads.

:class:`QueryPlan` is a validated query with its documents; :class:`QueryResult` what answering it gave.
:func:`check_request` and :func:`choose_documents` read nothing of the model (the CLI checks a request
before loading it). All timings are seconds from the start of planning (request accepted).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from service.documents_choice import DocumentChoice, QueryDoc
from service.errors import ServiceError

if TYPE_CHECKING:
    from service.settings import Settings

MODES = ("linked", "full")
"""Query modes: the cached documents re-linked (KVLink), or full prefill of the same prompt (baseline)."""


@dataclass
class QueryPlan:
    """Validated query with its documents; ``t0`` is ``time.perf_counter()`` at the start."""

    tenant: str
    question: str
    docs: list[QueryDoc]
    retrieval_s: float
    t0: float
    k: int | None = None
    adapter: str | None = None
    sampling: dict = field(default_factory=dict)
    mode: str = "linked"
    text_ids: list[int] | None = None
    retention: float | None = None
    explain: bool = False
    attribution: str = "attention"  # explain's method: "attention" or "leave_one_out" (kvlink_rag.explain.leave_one_out)
    recompute_ratio: float = 0.0
    cold: bool = False  # mode full's comparison: no prefix-tree read or insert (KVLINK_RAG_FULL_MODE_CACHED)


@dataclass
class QueryResult:
    """Answer text and ids, per-document cache hits, timings (s) and token counts."""

    answer: str
    token_ids: list[int]
    docs: list[QueryDoc]
    cache_hits: list[bool]
    timings: dict[str, float]
    context_tokens: int
    finish_reason: str
    cached_tokens: int = 0
    attribution: dict | None = None
    token_sources: dict[str, int] = field(default_factory=dict)
    logprobs: list | None = None  # with sampling["logprobs"]: a TokenLogprob per generated token

    def documents(self) -> list[dict]:
        """``[{id, title, version, content_hash, cache_hit, score, chunk}]`` in prompt order (``chunk``: the
        index of a retrieved chunk, None for a whole document); with an attribution
        (``explain``) also ``attribution`` (share) and ``passages`` (``[{start, end, share}]``) per document."""
        docs = [{"id": d.doc_id, "title": d.document.title or "", "version": d.version,
                 "content_hash": d.content_hash, "cache_hit": hit, "score": d.score, "chunk": d.chunk}
                for d, hit in zip(self.docs, self.cache_hits, strict=True)]
        for d, att in zip(docs, (self.attribution or {}).get("documents", [])):
            d.update(attribution=att["share"], passages=att["passages"],
                     **({"log_likelihood_drop": att["log_likelihood_drop"]} if "log_likelihood_drop" in att else {}))
        return docs


def check_request(settings: Settings, question: str, document_ids: list[str] | None = None,
                  top_k: int | None = None, max_new_tokens: int | None = None) -> str:
    """The question, stripped, once the request's own fields are within ``settings``' limits (nothing is
    read: a front end can check a request before the model loads).

    Raises:
        ServiceError: 422 empty or too long question, both ``document_ids`` and ``top_k``, ``max_new_tokens``
            out of range.
    """
    question = (question or "").strip()
    if not question:
        raise ServiceError(422, "invalid_question", "question is empty")
    if len(question) > settings.max_question_chars:
        raise ServiceError(422, "question_too_long", f"question has {len(question)} characters; the limit "
                           f"is {settings.max_question_chars} (KVLINK_RAG_MAX_QUESTION_CHARS)")
    if document_ids is not None and top_k is not None:
        raise ServiceError(422, "invalid_request", "give either document_ids or top_k, not both")
    if max_new_tokens is not None and not 1 <= max_new_tokens <= settings.max_new_tokens_limit:
        raise ServiceError(422, "max_new_tokens_out_of_range", "max_new_tokens must be within "
                           f"1..{settings.max_new_tokens_limit} (KVLINK_RAG_MAX_NEW_TOKENS_LIMIT), got {max_new_tokens}")
    return question


def choose_documents(choice: DocumentChoice, tenant: str, question: str, document_ids: list[str] | None = None,
                     top_k: int | None = None, required: bool = True,
                     cutoff: tuple[float | None, float | None] = (None, None)) -> list[QueryDoc]:
    """The documents ``document_ids``, else the ``top_k`` (default ``KVLINK_RAG_DEFAULT_TOP_K``) BM25 matches
    of ``question`` above the score cut-off; no engine needed (a front end can check them before the model
    loads). Without ``required``, retrieving nothing gives ``[]`` (a chat without documents); ``cutoff``:
    ``(min_relative_score, min_score)``, None for the settings.

    Raises:
        ServiceError: as :meth:`DocumentChoice.by_ids` / :meth:`DocumentChoice.retrieve` (422 out of range,
            404 unknown ids or nothing matching, 409 corrupt).
    """
    if document_ids is not None:
        return choice.by_ids(tenant, document_ids)
    return choice.retrieve(tenant, question, choice.settings.default_top_k if top_k is None else top_k, required,
                           cutoff)


def check_recompute(mode: str, recompute_ratio: float | None, explain: bool) -> None:
    """Raise for a query's CacheBlend ``recompute_ratio`` outside [0, 1], or above 0 with mode ``full`` or
    with ``explain`` (whose attention capture reads the link forward's layout).

    Raises:
        ServiceError: 422 ``recompute_ratio_out_of_range`` / ``recompute_unsupported``.
    """
    from kvlink_rag.reuse.blend import check_recompute_ratio

    if recompute_ratio is None:
        return
    try:
        check_recompute_ratio(recompute_ratio)
    except ValueError as e:
        raise ServiceError(422, "recompute_ratio_out_of_range", str(e)) from None
    if recompute_ratio > 0 and (mode == "full" or explain):
        raise ServiceError(422, "recompute_unsupported", "recompute_ratio applies to linked answers without "
                           "explain (mode 'linked'), not to the full-prefill comparison or explained answers")


def check_generation(settings: Settings, sampling: dict) -> dict:
    """``sampling`` with ``stop`` as a tuple of strings, once ``stop`` and ``min_tokens`` are valid
    (``min_tokens`` at most the request's ``max_new_tokens``, else the setting).

    Raises:
        ServiceError: 422 ``invalid_stop`` / ``min_tokens_out_of_range``.
    """
    from kvlink_rag.decoding.stop_strings import normalize_stop

    sampling = dict(sampling)
    try:
        sampling["stop"] = normalize_stop(sampling.get("stop")) or None
    except ValueError as e:
        raise ServiceError(422, "invalid_stop", str(e)) from None
    limit = sampling.get("max_new_tokens") or settings.max_new_tokens
    low = sampling.get("min_tokens")
    if low is not None and not 0 <= low <= limit:
        raise ServiceError(422, "min_tokens_out_of_range", f"min_tokens must be within 0..{limit} (max_tokens or "
                           f"KVLINK_RAG_MAX_NEW_TOKENS); got {low}")
    return sampling


def choice_plans(settings: Settings, plan: QueryPlan, n: int | None) -> list[QueryPlan]:
    """``n`` plans of one request (OpenAI's ``n`` choices): ``plan`` and copies sampling with seeds
    ``seed + i`` (mod 2^64; ``seed`` 0 when not given), so sampled choices differ and each is reproducible.
    Their prompts are the same, so the scheduler computes it once and the others read it from the prefix
    tree (requests over the same documents are admitted a step apart for that).

    Raises:
        ServiceError: 422 ``n_out_of_range`` outside 1..``KVLINK_RAG_MAX_CHOICES``.
    """
    n = 1 if n is None else n
    if not 1 <= n <= settings.max_choices:
        raise ServiceError(422, "n_out_of_range", f"n must be within 1..{settings.max_choices} "
                           f"(KVLINK_RAG_MAX_CHOICES), got {n}")
    plans = [plan]
    for i in range(1, n):
        p = copy.copy(plan)
        p.sampling = {**plan.sampling, "seed": (plan.sampling.get("seed", 0) + i) % 2**64}
        plans.append(p)
    return plans

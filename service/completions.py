"""Legacy completions (``/v1/completions``): a raw prompt continued by the model, no documents, no chat
template, no system prompt (mode ``plain`` of the batching scheduler; repeated prompt prefixes are shared
through its prefix tree)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from service.errors import ServiceError
from service.query_plan import QueryPlan, check_generation

if TYPE_CHECKING:
    from service.queries import QueryService

PROMPT_CHARS_FACTOR = 8  # a prompt may be this many times KVLINK_RAG_MAX_QUESTION_CHARS (as assistant turns)


def prompt_ids(queries: QueryService, prompt: str | list[int]) -> list[int]:
    """Token ids of ``prompt``: a string tokenised as the model's tokenizer does (special tokens written in
    it count, as in vLLM), or the ids themselves once each is in the vocabulary.

    Raises:
        ServiceError: 422 ``invalid_prompt`` (empty, too long, an id outside the vocabulary).
    """
    tok = queries.engine.lm.tokenizer
    if isinstance(prompt, str):
        limit = queries.settings.max_question_chars * PROMPT_CHARS_FACTOR
        if len(prompt) > limit:
            raise ServiceError(422, "invalid_prompt", f"prompt has {len(prompt)} characters; the limit is {limit} "
                               f"({PROMPT_CHARS_FACTOR}x KVLINK_RAG_MAX_QUESTION_CHARS)")
        ids = tok(prompt, add_special_tokens=True)["input_ids"]
    else:
        vocab = len(tok)
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise ServiceError(422, "invalid_prompt", f"token id(s) {bad[:5]} are outside the vocabulary (0..{vocab - 1})")
        ids = list(prompt)
    if not ids:
        raise ServiceError(422, "invalid_prompt", "prompt is empty")
    return [int(t) for t in ids]


def plan_completion(queries: QueryService, tenant: str, prompt: str | list[int], **sampling) -> QueryPlan:
    """The plan of a completion of ``prompt`` (see :func:`prompt_ids`) with ``sampling`` (max_new_tokens,
    temperature, top_p, seed, stop, ignore_eos, min_tokens); the query-side adapter is off.

    Raises:
        ServiceError: 422 invalid prompt, sampling fields out of range.
    """
    t0 = time.perf_counter()
    limit = queries.settings.max_new_tokens_limit
    n = sampling.get("max_new_tokens")
    if n is not None and not 1 <= n <= limit:
        raise ServiceError(422, "max_new_tokens_out_of_range", f"max_tokens must be within 1..{limit} "
                           f"(KVLINK_RAG_MAX_NEW_TOKENS_LIMIT), got {n}")
    sampling = check_generation(queries.settings, sampling)
    ids = prompt_ids(queries, prompt)
    plan = QueryPlan(tenant, prompt if isinstance(prompt, str) else "", [], 0.0, t0, adapter="none",
                     sampling={k: v for k, v in sampling.items() if v is not None}, mode="plain")
    plan.text_ids, plan.retention = ids, 1.0
    return plan

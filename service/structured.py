"""What a planned OpenAI request adds to its sampling: ``logprobs`` (alternatives per token) and a compiled
``response_format`` grammar (:mod:`kvlink_rag.decoding.grammar`), checked against the rest of the plan."""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.errors import ServiceError

if TYPE_CHECKING:
    from service.queries import QueryService
    from service.query_plan import QueryPlan


def add_outputs(queries: QueryService, plan: QueryPlan, logprobs: int | None, response_spec: dict | None) -> None:
    """Put ``logprobs`` and the grammar of ``response_spec`` (an OpenAI ``response_format``, None for text) into
    ``plan.sampling`` (their :class:`~kvlink_rag.decoding.generate.SamplingParams` fields). The grammar is compiled here,
    once per request (its ``n`` choices share it). Every request runs in the batching scheduler, whose step
    computes both from its own logits (explain, retention and CacheBlend included).

    Raises:
        ServiceError: 400 ``invalid_response_format`` (unknown type, invalid schema: the message says why);
            422 ``unsupported_combination`` (a grammar with ``ignore_eos`` or ``min_tokens`` above 0, which
            could forbid the only token that ends a complete JSON value).
    """
    from kvlink_rag.decoding.grammar import InvalidGrammar, response_grammar

    if logprobs is not None:
        plan.sampling["logprobs"] = logprobs
    if response_spec is None:
        return
    if plan.sampling.get("ignore_eos") or plan.sampling.get("min_tokens"):
        raise ServiceError(422, "unsupported_combination", "response_format cannot be combined with ignore_eos or "
                           "min_tokens: the end of the JSON value is the end of the answer")
    lm = queries.engine.lm
    try:
        plan.sampling["grammar"] = response_grammar(lm.tokenizer, int(lm.config.vocab_size), response_spec)
    except InvalidGrammar as e:
        raise ServiceError(400, "invalid_response_format", str(e)) from None

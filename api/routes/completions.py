"""OpenAI's legacy ``POST /v1/completions``: a raw prompt (a string, or token ids) continued by the model.

No documents, no chat template, no system prompt (:mod:`service.completions`); ``max_tokens``,
``temperature``, ``top_p``, ``seed``, ``stop``, vLLM's ``ignore_eos`` and ``min_tokens``, ``stream`` with
``stream_options.include_usage``, ``logprobs`` (0..5 alternatives) and ``response_format`` / ``guided_json``
(:mod:`api.output_fields`). A batch of prompts is refused (one prompt per request), and so are the
OpenAI fields without an implementation (``echo``, ``suffix``, ``best_of``...); ``n`` choices sample with
seeds ``seed + i``.
"""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter
from typing import Annotated

from pydantic import ConfigDict, Field, WithJsonSchema, field_validator

from api.contract import limit
from api.deps import QueriesDep, StateDep, TenantDep
from api.errors import error_responses
from api.generation_fields import OpenAIFields
from api.logprobs_format import LogprobsFormat
from api.openai_format import (MODEL_ID, STREAM_RESPONSE, adapter_of_model, answers, n_usage,
                               stream_response)
from api.output_fields import CompletionOutputFields
from api.schemas import MaxNewTokens, Seed, StreamOptions, Temperature, TopP
from service.errors import ServiceError
from service.text_rules import cut
from service.query_plan import choice_plans
from service.structured import add_outputs

router = APIRouter(prefix="/v1", tags=["openai"], responses=error_responses(401, 503))
MAX_PROMPT_IDS = 1 << 20
TOKEN_ID = {"type": "integer", "minimum": 0, **limit(maximum="max_token_id")}
PROMPT_TEXT = {"type": "string", "minLength": 1, **limit(maxLength="max_prompt_chars")}
PROMPT_IDS = {"type": "array", "minItems": 1, "maxItems": MAX_PROMPT_IDS, "items": TOKEN_ID}
PROMPT_SCHEMA = {"anyOf": [PROMPT_TEXT, {"type": "array", "minItems": 1, "maxItems": 1, "items": PROMPT_TEXT}, PROMPT_IDS,
                           {"type": "array", "minItems": 1, "maxItems": 1, "items": PROMPT_IDS}],
                 "description": "One prompt per request: text, or token ids (each below the vocabulary size)."}


class CompletionIn(CompletionOutputFields, OpenAIFields):
    """``/v1/completions``: one prompt (a string, a list of one string, token ids or a list of one list of
    token ids) and the sampling fields; unknown fields are ignored with a warning (vLLM's rule)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = Field(None, max_length=200)
    prompt: Annotated[str | list[str] | list[int] | list[list[int]], WithJsonSchema(PROMPT_SCHEMA)]
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: MaxNewTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    n: int | None = Field(None, ge=1, description="Choices (at most KVLINK_RAG_MAX_CHOICES), seeds seed + i.",
                          json_schema_extra=limit(maximum="max_choices"))

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list) and v and isinstance(v[0], (str, list)):
            if len(v) != 1:
                raise ValueError(f"a batch of {len(v)} prompts is not supported: send one prompt per request")
            v = v[0]
        if isinstance(v, list) and len(v) > MAX_PROMPT_IDS:
            raise ValueError(f"at most {MAX_PROMPT_IDS} token ids")
        return v


def _refuse_adapter_model(model: str | None, queries) -> None:
    """A raw prompt runs the served model without query-side adapters: a ``model`` naming one (as chat accepts)
    is refused, never silently answered without it."""
    if adapter_of_model(model, queries) is not None:
        raise ServiceError(422, "adapter_not_supported", f"model {model!r} is a query-side adapter, which serves linked "
                           f"documents (/v1/chat/completions, /v1/query); /v1/completions continues a raw prompt with "
                           f"the served model: use model {MODEL_ID!r} here")


def _choice(text: str | None, finish: str | None) -> dict:
    return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}


@router.post("/completions", responses={**STREAM_RESPONSE, **error_responses(422)})
async def completions(body: CompletionIn, tenant: TenantDep, queries: QueriesDep, state: StateDep):
    """Complete ``prompt`` with the served model (OpenAI's legacy completions wire format); a ``model`` naming a
    query-side adapter is a 422 ``adapter_not_supported`` (adapters serve linked documents, chat and /v1/query)."""
    from service.completions import plan_completion

    _refuse_adapter_model(body.model, queries)

    sampling = dict(max_new_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p,
                    seed=body.seed, **body.generation())
    spec = body.response_spec()

    def plan_it():
        p = plan_completion(queries, tenant, body.prompt, **sampling)
        add_outputs(queries, p, body.logprobs_asked(), spec)
        return p

    plan = await state.gates.run_planning(plan_it)
    plans = choice_plans(state.settings, plan, body.n)
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": body.model or MODEL_ID}
    tok = queries.engine.lm.tokenizer
    fmt = LogprobsFormat(tok, chat=False) if body.logprobs_asked() is not None else None
    if body.stream:
        return await stream_response(state, plans, head, _choice,
                                     bool(body.stream_options and body.stream_options.include_usage),
                                     "/v1/completions", logprobs=fmt)
    results = await answers(state, plans)
    stops = plan.sampling.get("stop", ())
    choices = [{**_choice(cut(tok.decode(r.token_ids, skip_special_tokens=True), stops), r.finish_reason), "index": i,
                "logprobs": fmt and fmt.of(r.logprobs or [], i)}
               for i, r in enumerate(results)]  # not stripped: the raw text
    return {**head, "choices": choices, "usage": n_usage(results)}

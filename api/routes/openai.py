"""OpenAI-compatible ``POST /v1/chat/completions`` and ``GET /v1/models``.

The whole message list (system, user, assistant, in order) is the conversation, framed by the model's
chat template after the documents (:mod:`kvlink_rag.text.conversation`); the last user message picks them
(BM25, above the score cut-off) unless ``document_ids`` names them; when it retrieves none (no documents,
or none relevant: a greeting) the chat is a plain one without documents. Earlier turns' KV is found in the
scheduler's prefix tree, so a new turn prefills only its new message; ``usage.prompt_tokens_details.cached_tokens``
counts the prompt tokens not computed for the request. Documents: ``document_ids`` or ``top_k`` as extra
body fields (the openai client's ``extra_body``); neither means ``top_k = KVLINK_RAG_DEFAULT_TOP_K``. The
response carries the usual fields plus ``kvlink: {documents, timings}``; with ``stream: true`` it is
``chat.completion.chunk`` events ending with ``data: [DONE]`` (:mod:`api.openai_format`); a failure once
the stream has started sends an error object (``{"error": {...}}``, which the openai client raises) and
then ``data: [DONE]``. The stream starts once the first token is there: a refusal before it (a full queue:
503 with ``Retry-After``; a conversation longer than the context: 422) is an HTTP error response, as
without ``stream``. ``logprobs`` / ``top_logprobs`` (raw model log-softmax, vLLM's default) and
``response_format`` (``json_object``, ``json_schema``; vLLM's ``guided_json``: grammar-constrained decoding)
are :mod:`api.output_fields`. A ``model`` naming a query-side adapter (``GET /v1/models`` lists them, each with
``parent`` the served model: vLLM's convention for LoRA adapters) answers with it, as the ``adapter`` field does;
any other ``model`` is the served model.
"""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter

from api.deps import QueriesDep, StateDep, TenantDep
from api.errors import error_responses
from api.logprobs_format import LogprobsFormat
from api.openai_format import (MODEL_ID, STREAM_RESPONSE, adapter_of_model, answers, extras, n_usage,
                               stream_response)
from api.schemas import ChatIn
from service.errors import ServiceError
from service.query_plan import choice_plans
from service.structured import add_outputs

router = APIRouter(prefix="/v1", tags=["openai"], responses=error_responses(401, 503))


def _delta(text: str | None, finish: str | None) -> dict:
    return {"index": 0, "delta": {} if text is None else {"content": text}, "finish_reason": finish}


def _role(text: str | None, finish: str | None) -> dict:
    return {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}


@router.post("/chat/completions", responses={**STREAM_RESPONSE, **error_responses(404, 409, 422)})
async def chat_completions(body: ChatIn, tenant: TenantDep, queries: QueriesDep, state: StateDep):
    """Chat completion grounded in the tenant's documents (OpenAI wire format)."""
    from service.chat import turns as chat_turns

    turns = chat_turns((m.role, m.text()) for m in body.messages)
    spec = body.response_spec()
    adapter = _chat_adapter(body, queries)

    def plan_it():
        p = queries.plan_chat(tenant, turns, body.document_ids, body.top_k, body.k, adapter, retention=body.retention,
                              explain=body.explain, attribution=body.attribution,
                              recompute_ratio=body.recompute_ratio,
                              cutoff=(body.min_relative_score, body.min_score), **body.sampling())
        add_outputs(queries, p, body.logprobs_asked(), spec)
        return p

    plan = await state.gates.run_planning(plan_it)
    plans = choice_plans(state.settings, plan, body.n)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": body.model or MODEL_ID}
    fmt = LogprobsFormat(queries.engine.lm.tokenizer, chat=True) if body.logprobs_asked() is not None else None
    if body.stream:
        return await stream_response(state, plans, head, _delta,
                                     bool(body.stream_options and body.stream_options.include_usage),
                                     "/v1/chat/completions", _role, fmt)
    results = await answers(state, plans)
    return {**head, "object": "chat.completion",
            "choices": [{"index": i, "message": {"role": "assistant", "content": r.answer},
                         "finish_reason": r.finish_reason, "logprobs": fmt and fmt.of(r.logprobs or [], i)}
                        for i, r in enumerate(results)],
            "usage": n_usage(results), "kvlink": extras(results[0])}


def _chat_adapter(body: ChatIn, queries) -> str | None:
    """The adapter a chat asks for: its ``adapter`` field, else its ``model`` when that names an adapter.

    Raises:
        ServiceError: 422 ``adapter_conflict`` when ``model`` names one adapter and ``adapter`` another.
    """
    named = adapter_of_model(body.model, queries)
    if named is not None and body.adapter is not None and body.adapter != named:
        raise ServiceError(422, "adapter_conflict", f"model {named!r} is an adapter and adapter is {body.adapter!r}: "
                           f"name the adapter once (model, or adapter with model {MODEL_ID!r})")
    return body.adapter or named


def _adapter_models(queries) -> list[str]:
    """The named adapters a ``model`` may name (``default`` and ``none`` are the served model)."""
    return [n for n in queries.variants.names() if n not in ("default", "none")]


@router.get("/models")
async def models(state: StateDep, queries: QueriesDep, tenant: TenantDep) -> dict:
    """The served model (OpenAI ``models.list``); ``root`` is the served checkpoint's folder (as vLLM's),
    which also holds its tokenizer: a client that needs one (guidellm's ``--processor``) can load it from there;
    ``max_model_len`` is the model's context. Then each named query-side adapter as a model with ``parent`` the
    served model and ``root`` its artifact (vLLM lists LoRA adapters so); ``model`` in a chat request picks it."""
    lm = state.engine.lm
    root = getattr(lm.tokenizer, "name_or_path", "") or state.settings.model
    entry = {"object": "model", "created": int(state.started), "owned_by": "kvlink-rag", "max_model_len": lm.max_positions}
    data = [{"id": MODEL_ID, **entry, "root": root}]
    for name in _adapter_models(queries):
        if (path := queries.variants.path(name)) is not None:  # None: its file went away since the listing
            data.append({"id": name, **entry, "root": str(path), "parent": MODEL_ID})
    return {"object": "list", "data": data}

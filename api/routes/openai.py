"""OpenAI-compatible ``POST /v1/chat/completions`` and ``GET /v1/models``.

The whole message list (system, user, assistant, in order) is the conversation, framed by the model's
chat template after the documents (:mod:`kvlink_rag.conversation`); the last user message picks them
(BM25) unless ``document_ids`` names them. Earlier turns' KV is found in the scheduler's prefix tree, so a
new turn prefills only its new message; ``usage.prompt_tokens_details.cached_tokens`` counts the prompt
tokens not computed for the request. Documents: ``document_ids`` or ``top_k`` as extra body fields (the openai client's
``extra_body``); neither means ``top_k = KVLINK_RAG_DEFAULT_TOP_K``. The response carries the usual
fields plus ``kvlink: {documents, timings}``; with ``stream: true`` it is ``chat.completion.chunk``
events ending with ``data: [DONE]``, starting once the first token is there: a refusal before it (a full
queue: 503 with ``Retry-After``; a conversation longer than the context: 422) is an HTTP error response,
as without ``stream``. A failure once the stream has started sends an error object (``{"error": {...}}``,
which the openai client raises) and then ``data: [DONE]``.
"""

from __future__ import annotations

import json
import time
import uuid

from fastapi import APIRouter
from sse_starlette import EventSourceResponse

from api.deps import QueriesDep, StateDep, TenantDep
from api.errors import stream_error_body
from api.schemas import ChatIn
from api.streaming import query_stream, started
from service.queries import QueryResult

router = APIRouter(prefix="/v1", tags=["openai"])
MODEL_ID = "kvlink-rag"


def _usage(r: QueryResult) -> dict:
    """OpenAI's usage; ``prompt_tokens_details.cached_tokens``: prompt tokens not computed for this request
    (shared prefix tree, the prefix KV, stored document caches)."""
    return {"prompt_tokens": r.context_tokens, "completion_tokens": len(r.token_ids),
            "total_tokens": r.context_tokens + len(r.token_ids),
            "prompt_tokens_details": {"cached_tokens": r.cached_tokens}}


def _extras(r: QueryResult) -> dict:
    extras = {"documents": r.documents(), "timings": r.timings}
    if r.attribution is not None:  # explain: documents carry attribution and passages
        extras["prefix_attribution"] = r.attribution["prefix"]
    return extras


def _chunk(cid: str, created: int, model: str, delta: dict, finish: str | None = None, **extra) -> str:
    return json.dumps({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra})


async def _stream(items, cid: str, created: int, model: str):
    """Chunks of started :func:`api.streaming.query_stream`, always ending ``[DONE]``."""
    try:
        yield {"data": _chunk(cid, created, model, {"role": "assistant", "content": ""})}
        async for kind, value in items:
            if kind == "token":
                yield {"data": _chunk(cid, created, model, {"content": value})}
            else:
                yield {"data": _chunk(cid, created, model, {}, value.finish_reason, usage=_usage(value),
                                      kvlink=_extras(value))}
    except Exception as e:  # noqa: BLE001 - every failure once the stream started ends it with an error chunk
        yield {"data": json.dumps(stream_error_body(e, "/v1/chat/completions"))}
    yield {"data": "[DONE]"}


@router.post("/chat/completions")
async def chat_completions(body: ChatIn, tenant: TenantDep, queries: QueriesDep, state: StateDep):
    """Chat completion grounded in the tenant's documents (OpenAI wire format)."""
    from kvlink_rag.conversation import Turn

    turns = [Turn(m.role, m.text()) for m in body.messages]
    plan = await state.gates.run_planning(lambda: queries.plan_chat(
        tenant, turns, body.document_ids, body.top_k, body.k, retention=body.retention, explain=body.explain,
        recompute_ratio=body.recompute_ratio, max_new_tokens=body.max_completion_tokens or body.max_tokens,
        temperature=body.temperature, top_p=body.top_p, seed=body.seed))
    cid, created, model = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), body.model or MODEL_ID
    if body.stream:  # starts with the first token: a refusal before it is an HTTP status
        return EventSourceResponse(_stream(await started(query_stream(state, plan)), cid, created, model))
    r = await state.gates.run_model(queries.answer, plan)
    return {"id": cid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": r.answer},
                         "finish_reason": r.finish_reason, "logprobs": None}],
            "usage": _usage(r), "kvlink": _extras(r)}


@router.get("/models")
async def models(state: StateDep, tenant: TenantDep) -> dict:
    """The one served model (OpenAI ``models.list``)."""
    return {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "created": int(state.started),
                                        "owned_by": "kvlink-rag", "root": state.settings.model}]}

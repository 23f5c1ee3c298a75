"""``POST /v1/query``: answer a question over the tenant's documents from their cached KV.

With ``stream: true`` the answer comes as server-sent events: ``event: token`` (``{"text": piece}``)
per piece, then ``event: done`` with the documents and timings. The response starts with the first token:
whatever refuses the query before it (unknown ids, limits, a full queue: 503 with ``Retry-After``, a
prompt longer than the context: 422) is an ordinary JSON error response with its status. Any failure
once the stream has started ends it with ``event: error`` and the error body (``{"error": {...}}``, as a
JSON error response would have).

The route is asynchronous: planning runs in a thread of its own limiter, and the query waits for the
model on the event loop (:mod:`api.concurrency`), holding no thread while it waits.
"""

from __future__ import annotations

import json

from fastapi import APIRouter
from sse_starlette import EventSourceResponse

from api.deps import QueriesDep, StateDep, TenantDep
from api.errors import error_responses, stream_error_body
from api.openai_format import SSE_EVENT
from api.schemas import QueryIn, QueryOut
from api.streaming import query_stream, started
from service.queries import QueryResult

router = APIRouter(prefix="/v1", tags=["query"])


def query_out(r: QueryResult) -> dict:
    """The response body of a finished query."""
    return QueryOut(answer=r.answer, documents=r.documents(), timings=r.timings, context_tokens=r.context_tokens,
                    completion_tokens=len(r.token_ids), cached_tokens=r.cached_tokens, token_sources=r.token_sources,
                    finish_reason=r.finish_reason,
                    prefix_attribution=r.attribution["prefix"] if r.attribution else None,
                    attribution_method=r.attribution.get("method") if r.attribution else None).model_dump()


async def sse_events(items):
    """SSE dicts for ``sse_starlette`` from a started :func:`api.streaming.query_stream`; the last event is
    ``done`` or ``error``."""
    try:
        async for kind, value in items:
            if kind == "token":
                yield {"event": "token", "data": json.dumps({"text": value})}
            else:
                yield {"event": "done", "data": json.dumps(query_out(value))}
    except Exception as e:  # noqa: BLE001 - every failure once the stream started ends it with an error event
        yield {"event": "error", "data": json.dumps(stream_error_body(e, "/v1/query"))}


@router.post("/query", response_model=QueryOut,
             responses={200: {"content": {"text/event-stream": {"schema": SSE_EVENT}},
                              "description": "JSON, or server-sent events (token, done, error) with stream=true"},
                        **error_responses(400, 401, 404, 409, 422, 503)})
async def query(body: QueryIn, tenant: TenantDep, queries: QueriesDep, state: StateDep):
    """Answer ``question`` over ``document_ids`` or the ``top_k`` BM25 matches among the tenant's documents.
    A stream starts once its first token is there: what refuses the query before it is an HTTP status."""
    plan = await state.gates.run_planning(lambda: queries.plan(
        tenant, body.question, body.document_ids, body.top_k, body.k, body.adapter, body.mode,
        retention=body.retention, explain=body.explain, attribution=body.attribution,
        recompute_ratio=body.recompute_ratio,
        cutoff=(body.min_relative_score, body.min_score), **body.sampling()))
    if body.stream:
        return EventSourceResponse(sse_events(await started(query_stream(state, plan))))
    return query_out(await state.gates.run_model(queries.answer, plan))

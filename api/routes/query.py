"""``POST /v1/query``: answer a question over the tenant's documents from their cached KV.

With ``stream: true`` the answer comes as server-sent events: ``event: token`` (``{"text": piece}``)
per piece, then ``event: done`` with the documents and timings (or ``event: error`` with the error body).
"""

from __future__ import annotations

import json

from fastapi import APIRouter
from sse_starlette import EventSourceResponse

from api.answering import QueryResult
from api.deps import QueriesDep, TenantDep
from api.errors import ApiError, error_body
from api.schemas import QueryIn, QueryOut
from api.streaming import iterate_in_thread

router = APIRouter(prefix="/v1", tags=["query"])


def query_out(r: QueryResult) -> dict:
    """The response body of a finished query."""
    return QueryOut(answer=r.answer, documents=r.documents(), timings=r.timings, context_tokens=r.context_tokens,
                    completion_tokens=len(r.token_ids), finish_reason=r.finish_reason).model_dump()


async def sse_events(queries, plan):
    """SSE dicts for ``sse_starlette`` from :meth:`QueryService.stream`."""
    try:
        async for kind, value in iterate_in_thread(lambda: queries.stream(plan)):
            if kind == "token":
                yield {"event": "token", "data": json.dumps({"text": value})}
            else:
                yield {"event": "done", "data": json.dumps(query_out(value))}
    except ApiError as e:
        yield {"event": "error", "data": json.dumps(error_body(e.status, e.code, e.message))}


@router.post("/query", response_model=QueryOut,
             responses={200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE with stream=true"},
                        404: {"description": "unknown document ids / nothing matches"},
                        422: {"description": "over a limit"}})
def query(body: QueryIn, tenant: TenantDep, queries: QueriesDep):
    """Answer ``question`` over ``document_ids`` or the ``top_k`` BM25 matches among the tenant's documents."""
    plan = queries.plan(tenant, body.question, body.document_ids, body.top_k, body.k, body.adapter,
                        max_new_tokens=body.max_new_tokens, temperature=body.temperature, top_p=body.top_p,
                        seed=body.seed)
    if body.stream:
        return EventSourceResponse(sse_events(queries, plan))
    return query_out(queries.answer(plan))

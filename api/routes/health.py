"""``/healthz`` (the process is up), ``/health`` (vLLM's: the model serves), ``/readyz`` (model loaded, store open, Redis reachable when
configured; 503 otherwise) and ``/metrics`` (Prometheus text format).

All three are ``async`` and never wait for the model or for Starlette's thread pool: liveness answers on
the event loop; readiness checks run in the background (:mod:`service.probes`: every
``KVLINK_RAG_READINESS_INTERVAL_S``, each reported failing once it has run past
``KVLINK_RAG_READINESS_TIMEOUT_S``) and ``/readyz`` answers from their results within milliseconds whatever
a dependency does; metrics collection (which may touch LMDB or Redis) runs in a few threads of its own
(``api.concurrency.Gates.probe``) with a deadline.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from api.concurrency import ProbeTimeout
from api.errors import error_response, error_responses

router = APIRouter(tags=["health"])
FRESH_WAIT_S = 0.05  # readiness waits this long for fresh check results, then answers from the last ones
METRICS_TIMEOUT_S = 10.0


@router.get("/healthz")
async def healthz() -> dict:
    """Liveness: 200 while the process serves HTTP."""
    return {"status": "ok"}


@router.get("/health", response_class=Response, responses={200: {"description": "serving (empty body)"},
                                                          **error_responses(503)})
async def health(request: Request) -> Response:
    """vLLM's health check (guidellm and other vLLM clients ask it first): 200 with an empty body once the
    model is loaded and queries are served, else 503."""
    state = request.app.state.service
    ok = state is not None and state.engine is not None and state.queries is not None
    return Response(status_code=200) if ok else error_response(503, "not_ready", "the model is not loaded yet")


async def readiness(state) -> dict[str, str]:
    """``{check: "ok" | reason}`` for model, store, shared cache tier, index (Redis index only) and queue (broker
    only): the background checks (:class:`service.probes.ProbeMonitor`) are poked and given
    :data:`FRESH_WAIT_S` to finish, else their last results are reported (a check running past its timeout
    is reported failing)."""
    if state is None:
        return {"model": "not loaded", "store": "not open"}
    checks = {"model": "ok" if state.engine is not None and state.queries is not None else "not loaded"}
    if state.store is None or state.probes is None:
        checks["store"] = "not open"
        return checks
    running = state.probes.poke()
    if running:
        await asyncio.wait([asyncio.wrap_future(f) for f in running], timeout=FRESH_WAIT_S)
    checks.update(state.probes.results())
    return checks


class Readiness(BaseModel):
    """``/readyz``'s body: ``status`` and each check's ``ok`` or reason; ``mode`` and ``tenancy`` once started."""

    status: Literal["ready", "not ready"]
    checks: dict[str, str]
    mode: str | None = None
    tenancy: str | None = None


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness, "description": "not ready (see checks)"}})
async def readyz(request: Request) -> JSONResponse:
    """Readiness: 200 ``{"status": "ready", "checks": {...}}`` or 503 ``{"status": "not ready", ...}``."""
    state = request.app.state.service
    checks = await readiness(state)
    ok = all(v == "ok" for v in checks.values())
    body = {"status": "ready" if ok else "not ready", "checks": checks}
    if state is not None:
        body.update(mode=state.mode, tenancy=state.tenancy)
    return JSONResponse(body, status_code=200 if ok else 503)


@router.get("/metrics", response_class=Response, responses={
    200: {"description": "Prometheus text exposition format",
          "content": {"text/plain": {"schema": {"type": "string"}}}}, **error_responses(503)})
async def metrics(request: Request) -> Response:
    """Prometheus metrics of this process (collected in a probe thread: the queue depth may ask Redis)."""
    render = request.app.state.metrics.render
    state = request.app.state.service
    if state is None:
        data, content_type = render()
    else:
        try:
            data, content_type = await state.gates.probe(render, timeout=METRICS_TIMEOUT_S)
        except ProbeTimeout as e:
            return error_response(503, "metrics_timeout", f"metrics collection did not finish: {e}")
    return Response(data, media_type=content_type)

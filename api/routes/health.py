"""``/healthz`` (the process is up), ``/health`` (vLLM's: the model serves), ``/readyz`` (model loaded, store open, Redis reachable when
configured; 503 otherwise) and ``/metrics`` (Prometheus text format).

All three are ``async`` and never wait for the model or for Starlette's thread pool: liveness answers on
the event loop; readiness checks and metrics collection (which may touch LMDB or Redis) run in a few
threads of their own (``api.concurrency.Gates.probe``), each with a deadline, so they answer in
milliseconds however many queries are waiting.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from api.concurrency import ProbeTimeout
from api.errors import error_response

router = APIRouter(tags=["health"])
CHECK_TIMEOUT_S = 2.0
METRICS_TIMEOUT_S = 10.0


@router.get("/healthz")
async def healthz() -> dict:
    """Liveness: 200 while the process serves HTTP."""
    return {"status": "ok"}


@router.get("/health", responses={503: {"description": "the model is not loaded"}})
async def health(request: Request) -> Response:
    """vLLM's health check (guidellm and other vLLM clients ask it first): 200 with an empty body once the
    model is loaded and queries are served, else 503."""
    state = request.app.state.service
    ok = state is not None and state.engine is not None and state.queries is not None
    return Response(status_code=200) if ok else error_response(503, "not_ready", "the model is not loaded yet")


def blocking_checks(state) -> dict[str, tuple[Callable[[], None], str]]:
    """``{check: (fn raising when it fails, prefix of the failure)}`` for store, shared cache tier (when
    configured), index (Redis index only) and queue (broker only) of an opened ``state``."""
    checks = {"store": (state.store.blobs.ping, "unreadable")}
    if state.store.shared is not None:
        checks["shared_store"] = (state.store.shared.ping, "shared cache tier unreachable")
    if state.settings.index_url:
        checks["index"] = (lambda: state.store.index.ping(CHECK_TIMEOUT_S), "Redis unreachable")
    if state.settings.distributed and state.queue is not None:
        checks["queue"] = (state.queue.ping, "Redis broker unreachable")
    return checks


async def readiness(state) -> dict[str, str]:
    """``{check: "ok" | reason}`` for model, store, index (Redis index only) and queue (broker only)."""
    if state is None:
        return {"model": "not loaded", "store": "not open"}
    checks = {"model": "ok" if state.engine is not None and state.queries is not None else "not loaded"}
    if state.store is None:
        checks["store"] = "not open"
        return checks
    for name, (fn, failure) in blocking_checks(state).items():
        try:
            await state.gates.probe(fn, timeout=CHECK_TIMEOUT_S)
            checks[name] = "ok"
        except Exception as e:  # noqa: BLE001 - ProbeTimeout included
            checks[name] = f"{failure}: {e}"
    return checks


@router.get("/readyz", responses={503: {"description": "not ready (see checks)"}})
async def readyz(request: Request) -> JSONResponse:
    """Readiness: 200 ``{"status": "ready", "checks": {...}}`` or 503 ``{"status": "not ready", ...}``."""
    state = request.app.state.service
    checks = await readiness(state)
    ok = all(v == "ok" for v in checks.values())
    body = {"status": "ready" if ok else "not ready", "checks": checks}
    if state is not None:
        body.update(mode=state.mode, tenancy=state.tenancy)
    return JSONResponse(body, status_code=200 if ok else 503)


@router.get("/metrics", responses={503: {"description": "collection did not finish in time"}})
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

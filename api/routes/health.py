"""``/healthz`` (the process is up), ``/readyz`` (model loaded, store open, Redis reachable when
configured; 503 otherwise) and ``/metrics`` (Prometheus text format)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict:
    """Liveness: 200 while the process serves HTTP."""
    return {"status": "ok"}


def readiness(state) -> dict[str, str]:
    """``{check: "ok" | reason}`` for model, store, index (Redis index only) and queue (broker only)."""
    checks: dict[str, str] = {}
    if state is None:
        return {"model": "not loaded", "store": "not open"}
    checks["model"] = "ok" if state.engine is not None and state.queries is not None else "not loaded"
    if state.store is None:
        checks["store"] = "not open"
    else:
        try:
            with state.store.blobs.env.read():
                pass
            checks["store"] = "ok"
        except Exception as e:  # noqa: BLE001
            checks["store"] = f"unreadable: {e}"
        if state.settings.index_url:
            try:
                state.store.index.r.ping()
                checks["index"] = "ok"
            except Exception as e:  # noqa: BLE001
                checks["index"] = f"Redis unreachable: {e}"
    if state.settings.distributed and state.queue is not None:
        try:
            state.queue.ping()
            checks["queue"] = "ok"
        except Exception as e:  # noqa: BLE001
            checks["queue"] = f"Redis broker unreachable: {e}"
    return checks


@router.get("/readyz", responses={503: {"description": "not ready (see checks)"}})
def readyz(request: Request) -> JSONResponse:
    """Readiness: 200 ``{"status": "ready", "checks": {...}}`` or 503 ``{"status": "not ready", ...}``."""
    state = getattr(request.app.state, "service", None)
    checks = readiness(state)
    ok = all(v == "ok" for v in checks.values())
    body = {"status": "ready" if ok else "not ready", "checks": checks}
    if state is not None:
        body.update(mode=state.mode, tenancy=state.tenancy)
    return JSONResponse(body, status_code=200 if ok else 503)


@router.get("/metrics")
def metrics(request: Request) -> Response:
    """Prometheus metrics of this process."""
    data, content_type = request.app.state.metrics.render()
    return Response(data, media_type=content_type)

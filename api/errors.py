"""Errors as JSON: ``{"error": {"code", "message", "type"}}`` (the OpenAI error shape) with a 4xx/5xx status.

Handlers turn request validation errors (malformed JSON, wrong types, unknown fields) into 422 with
one readable message, an unreachable Redis (index or broker) into 503, :class:`ApiError` into its own
status, and anything else into 500.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.request_body import INVALID_UNICODE
from service.errors import ServiceError, redis_errors

log = logging.getLogger(__name__)

REDIS_DOWN = ("Redis is unreachable: the document index and the task queue are unavailable, so documents "
              "cannot be ingested, listed, updated or deleted; queries that name cached documents by id "
              "still answer. Retry when Redis is back.")


ApiError = ServiceError  # the routes raise the service's error: it carries its HTTP status


def error_body(status: int, code: str, message: str, **extra) -> dict:
    """``{"error": {"code", "message", "type"}}``; ``type`` is ``invalid_request_error`` for 4xx."""
    kind = "invalid_request_error" if status < 500 else "service_unavailable" if status == 503 else "server_error"
    return {"error": {"code": code, "message": message, "type": kind, **extra}}


def error_response(status: int, code: str, message: str, **extra) -> JSONResponse:
    return JSONResponse(error_body(status, code, message, **extra), status_code=status)


UNION_TAGS = ("document", "batch")  # the tags of the ingest body's union (api.schemas.IngestIn), not fields


def describe_validation(errors) -> str:
    """One line per problem: ``body.question: Field required``; malformed JSON says so. Locations name
    the request's own fields (``body.id``, not the union tag ``body.document.id``), text that is not valid
    Unicode the field holding it (``body.messages.0.content[1].text``)."""
    parts = []
    for e in errors:
        if e.get("type") == "json_invalid":
            ctx = e.get("ctx", {}).get("error", "")
            parts.append(f"malformed JSON body: {ctx}".rstrip(": "))
            continue
        raw = list(e.get("loc", ()))
        if len(raw) > 1 and raw[0] == "body" and raw[1] in UNION_TAGS:
            del raw[1]
        message = e.get("msg", "invalid")
        if e.get("type") == INVALID_UNICODE:  # found inside the body: its path names the field
            raw.append(e["ctx"]["where"])
            message = e["ctx"]["problem"]
        loc = ".".join(str(x) for x in raw)
        parts.append(f"{loc}: {message}")
    return "; ".join(parts) or "invalid request"


def error_of(exc: BaseException) -> tuple[int, str, str]:
    """``(status, code, message)`` the API answers for ``exc``: an :class:`ApiError` as it says, an
    unreachable Redis 503, anything else 500 ``internal_error``."""
    if isinstance(exc, ApiError):
        return exc.status, exc.code, exc.message
    if isinstance(exc, redis_errors()):
        return 503, "redis_unavailable", f"{REDIS_DOWN} ({exc})"
    return 500, "internal_error", f"internal error: {type(exc).__name__}: {exc}"


def stream_error_body(exc: BaseException, where: str) -> dict:
    """The error body that ends a stream which failed with ``exc`` (logged unless it is an ApiError)."""
    status, code, message = error_of(exc)
    if status == 503:
        log.warning("Redis unreachable during a stream of %s: %s", where, exc)
    elif status >= 500:
        log.error("unhandled error in a stream of %s", where, exc_info=exc)
    return error_body(status, code, message)


def install(app: FastAPI) -> None:
    """Register the handlers on ``app``."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        response = error_response(exc.status, exc.code, exc.message)
        if exc.retry_after_s is not None:
            response.headers["Retry-After"] = str(max(1, round(exc.retry_after_s)))
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        code = "malformed_json" if any(e.get("type") == "json_invalid" for e in errors) else "invalid_request"
        return error_response(422, code, describe_validation(errors))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail))

    async def _redis_down(request: Request, exc: Exception):
        log.warning("Redis unreachable during %s %s: %s", request.method, request.url.path, exc)
        return error_response(*error_of(exc))

    for exc_type in redis_errors():
        app.add_exception_handler(exc_type, _redis_down)

    async def _unexpected(request: Request, exc: Exception):
        log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(*error_of(exc))

    app.add_exception_handler(Exception, _unexpected)  # JSON 500 (Starlette still re-raises it to the server)

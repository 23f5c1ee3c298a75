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
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

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


def error_response(status: int, code: str, message: str, headers: dict | None = None, **extra) -> JSONResponse:
    return JSONResponse(error_body(status, code, message, **extra), status_code=status, headers=headers)


class ErrorDetail(BaseModel):
    """What went wrong: a stable machine ``code``, a human ``message``, ``type`` (OpenAI's error type)."""

    model_config = ConfigDict(extra="allow")
    code: str = Field(..., description="Stable machine code, e.g. document_not_found, top_k_out_of_range.")
    message: str
    type: str = Field(..., description="invalid_request_error (4xx), service_unavailable (503), server_error.")


class ErrorOut(BaseModel):
    """Every error answer: ``{"error": {"code", "message", "type"}}`` (OpenAI's shape, on every route)."""

    error: ErrorDetail


RULES_BEYOND_SCHEMA = {  # error codes of rules across fields, the tokenizer or the model: no JSON schema says them
    "invalid_messages": "the conversation's order: user and assistant alternate, starting and ending with a "
                        "non-empty user message (kvlink_rag.text.conversation.check_turns)",
    "message_too_long": "a message's text (its parts joined) over KVLINK_RAG_MAX_QUESTION_CHARS (8x for assistant turns)",
    "context_too_long": "the prompt's tokens (documents, conversation) over the model's context",
    "min_tokens_out_of_range": "min_tokens above the request's max_tokens (else KVLINK_RAG_MAX_NEW_TOKENS)",
    "document_too_large": "a document's tokens over KVLINK_RAG_MAX_DOCUMENT_TOKENS or what a query can hold (413)",
    "metadata_too_large": "metadata over KVLINK_RAG_MAX_METADATA_BYTES as JSON bytes (413)",
    "invalid_response_format": "a response_format / guided_json schema that is not a JSON schema the grammar "
                               "compiler accepts (400, as OpenAI and vLLM answer it)",
}
ERROR_STATUSES = {
    400: "an adapter made for another model, or a body that is not readable text",
    401: "missing or unknown API key (only when KVLINK_RAG_API_KEYS is set)",
    404: "not found (unknown document ids or adapter, nothing retrieved)",
    409: "a named document cannot be served (corrupt or unreadable: re-ingest it)",
    413: "over a size limit (characters, tokens, metadata bytes, batch size)",
    422: "invalid request: a field out of its schema, or a rule across fields or the model (conversation order, "
         "the context length, min_tokens above max_tokens)",
    503: "not ready, overloaded (with Retry-After) or Redis unreachable; retry later",
}


def error_responses(*statuses: int) -> dict:
    """``responses=`` of a route: each of ``statuses`` with its description and the :class:`ErrorOut` body."""
    return {s: {"model": ErrorOut, "description": ERROR_STATUSES[s]} for s in statuses}


UNION_TAGS = ("document", "batch")  # the tags of the ingest body's union (api.document_schemas.IngestIn), not fields


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


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> str:
    """The ``Allow`` header of a 405 (RFC 9110): every method some route at the request's path answers
    (Starlette names only the first matching route's)."""
    routes = request.app.router.routes
    allowed = [m for m in METHODS
               if any(r.matches({**request.scope, "method": m})[0] == Match.FULL for r in routes)]
    return ", ".join(allowed)


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
        headers = {"Allow": allowed_methods(request)} if exc.status_code == 405 else exc.headers
        return error_response(exc.status_code, code, str(exc.detail), headers=headers)

    async def _redis_down(request: Request, exc: Exception):
        log.warning("Redis unreachable during %s %s: %s", request.method, request.url.path, exc)
        return error_response(*error_of(exc))

    for exc_type in redis_errors():
        app.add_exception_handler(exc_type, _redis_down)

    async def _unexpected(request: Request, exc: Exception):
        log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(*error_of(exc))

    app.add_exception_handler(Exception, _unexpected)  # JSON 500 (Starlette still re-raises it to the server)

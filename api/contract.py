"""The OpenAPI document as this server answers (``/openapi.json``), checked by schemathesis
(``tests/api/test_contract.py``).

FastAPI's document is adjusted to what the configured server does:

* security: the HTTP bearer scheme (and the 401 answers) only when ``KVLINK_RAG_API_KEYS`` is set;
  without keys no request needs ``Authorization``;
* every validation error is declared with the service's error body (:class:`api.errors.ErrorOut`), not
  FastAPI's ``HTTPValidationError`` (which this server never sends);
* limits that depend on settings or on the loaded model (``top_k`` at most ``KVLINK_RAG_MAX_TOP_K``, ``k``
  at most the loaded link tokens, token ids below the vocabulary size...) are written into the schemas
  where a field carries :func:`limit`'s marker.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from service.settings import Settings

MARKER = "x-kvlink-limit"
ERROR_REF = "#/components/schemas/ErrorOut"
FASTAPI_VALIDATION = ("HTTPValidationError", "ValidationError")


PY_WHITESPACE = ("\\t\\n\\u000b\\u000c\\r\\u001c-\\u001f \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f"
                 "\\u205f\\u3000")  # every character str.isspace() holds (what str.strip() strips), as a regex class
NON_BLANK = f"[^{PY_WHITESPACE}]"  # JSON-schema pattern of text not only whitespace (the server strips it)
def forbidden(*combinations: dict) -> dict:
    """``json_schema_extra`` of a request whose fields exclude each other: each combination maps field names
    to the JSON schema of a value that counts as given; a body matching all of one combination is refused."""
    return {"not": {"anyOf": [{"required": list(c), "properties": c} for c in combinations]}}


def refused(*cases: dict) -> dict:
    """``json_schema_extra`` of a request the server refuses when it matches any of ``cases`` (each a JSON schema
    of a body; its ``properties`` constrain only the fields present, so an absent field matches them)."""
    return {"not": {"anyOf": list(cases)}}


def every(*rules: dict) -> dict:
    """``json_schema_extra`` holding several of :func:`forbidden` / :func:`refused` at once."""
    return {"allOf": list(rules)}


def limit(**bounds: str) -> dict:
    """``json_schema_extra`` of a field whose bound depends on the server: ``limit(maximum="max_top_k")``
    (keys: a JSON-schema keyword such as maximum, maxLength, maxItems; values: a name of :func:`limit_values`).
    The document carries the tighter of the static bound and the configured one."""
    return {MARKER: bounds}


def limit_values(settings: Settings, engine=None) -> dict[str, int]:
    """The server-dependent bounds :func:`limit` may name (model-dependent ones once ``engine`` is loaded)."""
    from service.completions import PROMPT_CHARS_FACTOR

    values = {"max_top_k": settings.max_top_k, "max_query_documents": settings.max_query_documents,
              "max_new_tokens_limit": settings.max_new_tokens_limit, "max_choices": settings.max_choices,
              "max_question_chars": settings.max_question_chars, "max_document_chars": settings.max_document_chars,
              "max_batch_documents": settings.max_batch_documents,
              "max_prompt_chars": settings.max_question_chars * PROMPT_CHARS_FACTOR,
              "seed_max": 2**64 - 1}  # exact: FastAPI's document spells bounds as floats (2^64 - 1 -> 2^64)
    if engine is not None:
        lt = engine.link_tokens
        values.update(link_k=lt.k if lt is not None else 0, max_token_id=len(engine.lm.tokenizer) - 1)
    return values


def install(app: FastAPI, settings: Settings) -> None:
    """Serve :func:`document` as the app's OpenAPI document."""
    app.openapi = lambda: document(app, settings)


def document(app: FastAPI, settings: Settings) -> dict:
    """The OpenAPI document of ``app`` as configured by ``settings`` (kept once the model is loaded)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    state = app.state.service
    engine = state.engine if state is not None else None
    _declare_errors(doc)
    if not settings.api_keys:
        _without_security(doc)
    _apply_limits(doc, limit_values(settings, engine))
    if engine is not None:
        app.openapi_schema = doc
    return doc


def _operations(doc: dict):
    for path_item in doc.get("paths", {}).values():
        for op in path_item.values():
            if isinstance(op, dict) and "responses" in op:
                yield op


def _declare_errors(doc: dict) -> None:
    """A 400 on every operation with a body (one that is not readable text: FastAPI's "error parsing the
    body"), and FastAPI's 422 (``HTTPValidationError``) replaced by the error body this server sends
    (:class:`api.errors.ErrorOut`, which every route declares through :func:`api.errors.error_responses`)."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for op in _operations(doc):
        if "requestBody" in op:
            op["responses"].setdefault("400", {"description": "the body could not be read",
                                               "content": {"application/json": {"schema": {"$ref": ERROR_REF}}}})
        answer = op["responses"].get("422")
        if answer and "HTTPValidationError" in str(answer.get("content", "")):
            answer["content"] = {"application/json": {"schema": {"$ref": ERROR_REF}}}
            answer["description"] = "invalid request (a field out of its schema, or a rule across fields)"
    for name in FASTAPI_VALIDATION:
        schemas.pop(name, None)


def _without_security(doc: dict) -> None:
    """No API keys: no security requirement, no bearer scheme, no 401 answers."""
    doc.get("components", {}).pop("securitySchemes", None)
    for op in _operations(doc):
        op.pop("security", None)
        op["responses"].pop("401", None)


def _apply_limits(node: Any, values: dict[str, int]) -> None:
    """Replace every :data:`MARKER` in ``node`` (recursively) by its bounds."""
    if isinstance(node, list):
        for item in node:
            _apply_limits(item, values)
        return
    if not isinstance(node, dict):
        return
    bounds = node.pop(MARKER, None)
    for keyword, name in (bounds or {}).items():
        if name in values:
            node[keyword] = min(node.get(keyword, values[name]), values[name])
    for value in node.values():
        _apply_limits(value, values)

"""vLLM's operational endpoints beside the OpenAI ones: ``GET /version``, ``POST /tokenize`` and
``POST /detokenize`` (clients such as guidellm count tokens with them), using the served model's
tokenizer. ``/tokenize`` takes ``prompt`` (tokenised as ``/v1/completions`` does) or ``messages`` (the
chat's framing of a conversation without documents, as a plain chat is prompted)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

from fastapi import APIRouter
from pydantic import ConfigDict, Field, WithJsonSchema

from api.deps import QueriesDep, StateDep, TenantDep
from api.errors import error_responses
from api.request_body import RequestBody
from api.routes.completions import PROMPT_TEXT, TOKEN_ID
from api.schemas import MAX_CHAT_MESSAGES, ChatMessage

router = APIRouter(tags=["tokens"])
MAX_TOKEN_IDS = 1 << 20


class TokenizeIn(RequestBody):
    """One of ``prompt`` or ``messages`` (strict types, encodable text; unknown fields are ignored)."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"oneOf": [
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"}}}]})
    model: str | None = Field(None, max_length=200)
    prompt: Annotated[str | None, WithJsonSchema({"anyOf": [PROMPT_TEXT, {"type": "null"}]})] = None
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=MAX_CHAT_MESSAGES)
    add_special_tokens: bool = True


class DetokenizeIn(RequestBody):
    model_config = ConfigDict(extra="allow")
    model: str | None = Field(None, max_length=200)
    tokens: list[int] = Field(..., max_length=MAX_TOKEN_IDS, json_schema_extra={"items": TOKEN_ID})


@router.get("/version")
async def server_version() -> dict:
    """``{"version"}`` of the installed kvlink-rag."""
    try:
        return {"version": version("kvlink-rag")}
    except PackageNotFoundError:
        return {"version": "unknown"}


@router.post("/tokenize", responses=error_responses(401, 422, 503))
async def tokenize(body: TokenizeIn, tenant: TenantDep, queries: QueriesDep, state: StateDep) -> dict:
    """``{count, max_model_len, tokens}`` of ``prompt`` or ``messages``.

    Raises:
        ServiceError: 422 neither or both given, a bad conversation or a prompt over its limit.
    """
    from service.chat import conversation_prompt_ids
    from service.completions import prompt_ids
    from service.errors import ServiceError

    if (body.prompt is None) == (body.messages is None):
        raise ServiceError(422, "invalid_request", "give either prompt or messages")
    if body.prompt is not None:
        ids = prompt_ids(queries, body.prompt)
    else:
        ids = conversation_prompt_ids(queries.engine, [(m.role, m.text()) for m in body.messages])
    return {"count": len(ids), "max_model_len": queries.engine.lm.max_positions, "tokens": ids}


@router.post("/detokenize", responses=error_responses(401, 422, 503))
async def detokenize(body: DetokenizeIn, tenant: TenantDep, queries: QueriesDep) -> dict:
    """``{"prompt"}``: the text of ``tokens``.

    Raises:
        ServiceError: 422 an id outside the vocabulary.
    """
    from service.completions import prompt_ids

    ids = prompt_ids(queries, body.tokens) if body.tokens else []
    return {"prompt": queries.engine.lm.tokenizer.decode(ids)}

"""OpenAI wire format shared by ``/v1/chat/completions`` and ``/v1/completions``: usage, the ``kvlink``
extras and the server-sent-event stream of chunks (``stream_options.include_usage`` as the spec says: then
every chunk has ``usage: null`` and one last chunk with ``choices: []`` carries the usage; without it no
chunk has usage)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

from api.errors import stream_error_body
from api.streaming import iterate_in_thread
from service.queries import QueryResult

MODEL_ID = "kvlink-rag"

Choice = Callable[[str | None, str | None], dict]
"""``choice(text piece or None, finish_reason or None)`` -> one element of a chunk's ``choices``."""


def usage(r: QueryResult) -> dict:
    """OpenAI's usage; ``prompt_tokens_details.cached_tokens``: prompt tokens not computed for this request
    (shared prefix tree, the prefix KV, stored document caches)."""
    return {"prompt_tokens": r.context_tokens, "completion_tokens": len(r.token_ids),
            "total_tokens": r.context_tokens + len(r.token_ids),
            "prompt_tokens_details": {"cached_tokens": r.cached_tokens}}


def extras(r: QueryResult) -> dict:
    """The ``kvlink`` field: documents used (with explain, attribution) and stage timings."""
    out = {"documents": r.documents(), "timings": r.timings}
    if r.attribution is not None:  # explain: documents carry attribution and passages
        out["prefix_attribution"] = r.attribution["prefix"]
    return out


class ChunkStream:
    """The chunks of one streamed answer.

    Args:
        head: ``{id, object, created, model}`` of every chunk.
        choice: builds a chunk's choice (see :data:`Choice`).
        include_usage: ``stream_options.include_usage``.
        where: the route (for logged errors).
    """

    def __init__(self, head: dict, choice: Choice, include_usage: bool, where: str):
        self.head, self.choice, self.include_usage, self.where = head, choice, include_usage, where

    def chunk(self, choices: list[dict], **extra) -> dict:
        """One SSE event (``usage: null`` on every chunk when usage is asked for)."""
        body = {**self.head, "choices": choices, **extra}
        if self.include_usage:
            body.setdefault("usage", None)
        return {"data": json.dumps(body)}

    async def events(self, state, plan, first: list[dict] | None = None) -> AsyncIterator[dict]:
        """Chunks of :meth:`QueryService.stream` (run once the model is free), ``first`` chunk choices
        before them; a failure sends an error object; always ends with ``[DONE]``."""
        try:
            if first:
                yield self.chunk(first)
            async with state.gates.model_slot():
                async for kind, value in iterate_in_thread(lambda: state.queries.stream(plan)):
                    if kind == "token":
                        yield self.chunk([self.choice(value, None)])
                        continue
                    yield self.chunk([self.choice(None, value.finish_reason)], kvlink=extras(value))
                    if self.include_usage:
                        yield self.chunk([], usage=usage(value))
        except Exception as e:  # noqa: BLE001 - every failure ends the stream with an error chunk
            yield {"data": json.dumps(stream_error_body(e, self.where))}
        yield {"data": "[DONE]"}

"""OpenAI wire format shared by ``/v1/chat/completions`` and ``/v1/completions``: usage, the ``kvlink``
extras and the server-sent-event stream of chunks (``stream_options.include_usage`` as the spec says: then
every chunk has ``usage: null`` and one last chunk with ``choices: []`` carries the usage; without it no
chunk has usage)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

from sse_starlette import EventSourceResponse

from api.errors import stream_error_body
from api.logprobs_format import LogprobsFormat
from api.streaming import query_stream, started
from service.queries import QueryResult
from service.settings import SERVED_MODEL_ID

MODEL_ID = SERVED_MODEL_ID  # one id with the adapter names it keeps free (kvlink_rag.adapter_registry)


def adapter_of_model(model: str | None, queries) -> str | None:
    """``model`` when it names a query-side adapter (vLLM's convention for LoRA adapters: ``GET /v1/models`` lists
    them); None for no model, the served model or any other name. One file lookup, no listing."""
    return model if model not in (None, MODEL_ID) and queries.variants.path(model) is not None else None

SSE_EVENT = {"type": "object", "required": ["data"], "description": "One server-sent event (its data: JSON text).",
             "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}
STREAM_RESPONSE = {200: {"description": "the completion, or with stream=true server-sent events of chunks ending "
                         "with data: [DONE]", "content": {"text/event-stream": {"schema": SSE_EVENT}}}}
"""``responses=`` entry of a route that streams (OpenAPI: both media types of the 200 answer)."""

Choice = Callable[[str | None, str | None], dict]
"""``choice(text piece or None, finish_reason or None)`` -> one element of a chunk's ``choices``."""


def usage(r: QueryResult) -> dict:
    """OpenAI's usage; ``prompt_tokens_details.cached_tokens``: prompt tokens not computed for this request
    (shared prefix tree, the prefix KV, stored document caches)."""
    return {"prompt_tokens": r.context_tokens, "completion_tokens": len(r.token_ids),
            "total_tokens": r.context_tokens + len(r.token_ids),
            "prompt_tokens_details": {"cached_tokens": r.cached_tokens, **r.token_sources}}


def extras(r: QueryResult) -> dict:
    """The ``kvlink`` field: documents used (with explain, attribution) and stage timings."""
    out = {"documents": r.documents(), "timings": r.timings}
    if r.attribution is not None:  # explain: documents carry attribution and passages
        out["prefix_attribution"] = r.attribution["prefix"]
        out["attribution_method"] = r.attribution.get("method")
    return out


def n_usage(results: list[QueryResult]) -> dict:
    """Usage of ``n`` choices of one prompt: the prompt once, the completions summed, ``cached_tokens`` of
    the prompt as the choices found it (most: the others read the first one's prefill from the prefix tree)."""
    u = usage(results[0])
    done = sum(len(r.token_ids) for r in results)
    u.update(completion_tokens=done, total_tokens=u["prompt_tokens"] + done,
             prompt_tokens_details={**u["prompt_tokens_details"], "cached_tokens": max(r.cached_tokens for r in results)})
    return u


async def answers(state, plans: list) -> list[QueryResult]:
    """The finished results of ``plans`` (one per choice), run at once (the scheduler batches them)."""
    return list(await asyncio.gather(*(state.gates.run_model(state.queries.answer, p) for p in plans)))


class ChunkStream:
    """The chunks of one streamed request (one or more choices, interleaved as generated).

    Args:
        head: ``{id, object, created, model}`` of every chunk.
        choice: builds a chunk's choice (see :data:`Choice`).
        include_usage: ``stream_options.include_usage``.
        where: the route (for logged errors).
        logprobs: with ``logprobs`` asked: each chunk's choice carries the ``logprobs`` of the tokens that came
            since that choice's previous chunk (a text piece held back, by a stop string or an unfinished
            character, moves them to the next chunk).
    """

    def __init__(self, head: dict, choice: Choice, include_usage: bool, where: str,
                 logprobs: LogprobsFormat | None = None):
        self.head, self.choice, self.include_usage, self.where = head, choice, include_usage, where
        self.logprobs = logprobs
        self._pending: dict[int, list] = {}

    def chunk(self, choices: list[dict], **extra) -> dict:
        """One SSE event (``usage: null`` on every chunk when usage is asked for)."""
        body = {**self.head, "choices": choices, **extra}
        if self.include_usage:
            body.setdefault("usage", None)
        return {"data": json.dumps(body)}

    def _indexed(self, index: int, text: str | None, finish: str | None) -> dict:
        out = {**self.choice(text, finish), "index": index}
        pending = self._pending.pop(index, None)
        if self.logprobs is not None and pending:  # the tokens that arrived since the last chunk of this choice
            out["logprobs"] = self.logprobs.of(pending, index)
        return out

    async def events(self, items: AsyncIterator[tuple[int, str, object]], n: int, first: Choice | None = None
                     ) -> AsyncIterator[dict]:
        """Chunks of ``items`` (:func:`merged`, already :func:`api.streaming.started`, so a refusal before the
        first token was an HTTP status) of ``n`` choices, ``first`` chunks' choices before them; a failure
        sends an error object; always ends with ``[DONE]``."""
        results: list = [None] * n
        try:
            if first:
                yield self.chunk([{**first(None, None), "index": i} for i in range(n)])
            async for i, kind, value in items:
                if kind == "logprobs":
                    self._pending.setdefault(i, []).append(value)
                    continue
                if kind == "token":
                    yield self.chunk([self._indexed(i, value, None)])
                    continue
                results[i] = value
                yield self.chunk([self._indexed(i, None, value.finish_reason)], kvlink=extras(value))
            if self.include_usage:
                yield self.chunk([], usage=n_usage(results))
        except Exception as e:  # noqa: BLE001 - every failure ends the stream with an error chunk
            yield {"data": json.dumps(stream_error_body(e, self.where))}
        yield {"data": "[DONE]"}


async def stream_response(state, plans: list, head: dict, choice: Choice, include_usage: bool, where: str,
                          first: Choice | None = None, logprobs: LogprobsFormat | None = None):
    """The SSE response of ``plans`` (one per choice) as :class:`ChunkStream` chunks. It starts once the first
    token is there (:func:`api.streaming.started`), so a refusal before it (a full queue: 503 with
    ``Retry-After``; a prompt past the context: 422) raises here and is an HTTP status, not a started stream."""
    stream = ChunkStream(head, choice, include_usage, where, logprobs)
    return EventSourceResponse(stream.events(await started(merged(state, plans)), len(plans), first))


async def merged(state, plans: list) -> AsyncIterator[tuple[int, str, object]]:
    """``(choice index, kind, value)`` of every plan's stream (:func:`api.streaming.query_stream`), as they come;
    the first failure is raised (the other streams are cancelled, which cancels their requests)."""
    if len(plans) == 1:
        async for kind, value in query_stream(state, plans[0]):
            yield 0, kind, value
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, plan) -> None:
        try:
            async for kind, value in query_stream(state, plan):
                await queue.put((i, kind, value))
        except Exception as e:  # noqa: BLE001 - handed to the consumer
            await queue.put((i, "error", e))
        finally:
            queue.put_nowait((i, "end", None))

    tasks = [asyncio.create_task(pump(i, plan)) for i, plan in enumerate(plans)]
    try:
        ended = 0
        while ended < len(plans):
            i, kind, value = await queue.get()
            if kind == "error":
                raise value
            if kind == "end":
                ended += 1
                continue
            yield i, kind, value
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

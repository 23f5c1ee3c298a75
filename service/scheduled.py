"""Answering a planned query through the batching scheduler (:mod:`kvlink_rag.runtime.scheduler`).

The request's engine (its adapter loaded, a per-request recording view of the tenant's cache) is made in
the scheduler's thread when the request is admitted; token ids come back through the request's handle
and are turned into text pieces here, in the caller's thread. Closing the generator (client gone)
cancels the request: its slot is freed before the scheduler's next step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING

from kvlink_rag.runtime.cancel import Cancelled
from kvlink_rag.runtime.gen_request import GenRequest, GenResult
from kvlink_rag.runtime.block_pool import PoolExhausted
from kvlink_rag.runtime.limits import QueueFull
from kvlink_rag.runtime.scheduler import Scheduler
from kvlink_rag.types import ContextTooLong
from service.cancellation import RequestCancelled, check_cancelled, on_cancel
from service.errors import ServiceError

if TYPE_CHECKING:
    from kvlink_rag.decoding.answer import Answer
    from kvlink_rag.engine import Engine
    from store.recording_cache import RecordingCache


def scheduled_tokens(scheduler: Scheduler, engine: Engine, plan, make_engine: Callable[[], Engine],
                     text_ids: list[int]) -> Iterator[int]:
    """Submit the plan and yield its token ids; returns the :class:`GenResult` (``yield from``).

    The request is cancelled with the front end's :class:`~service.cancellation.CancelScope` (the client
    went away): it leaves the queue, or the batch before the next step, and stops its pending loads.

    Raises:
        ServiceError: 503 ``overloaded`` with ``retry_after_s`` when the queue is full; 422
            ``context_too_long`` when the prompt does not fit; 499 ``cancelled``
            (:class:`~service.cancellation.RequestCancelled`) when the request was cancelled.
    """
    check_cancelled("the query")
    link_k = engine.link_k if plan.mode == "linked" else 0
    req = GenRequest(make_engine, [d.document for d in plan.docs], text_ids, engine.sampling(**plan.sampling),
                     plan.mode, plan.k, t0=plan.t0, adapter=plan.adapter, retention=plan.retention,
                     recompute_ratio=plan.recompute_ratio, explain=plan.explain, cold=plan.cold,
                     tenant=plan.tenant)
    try:
        handle = scheduler.submit(req, link_k)
    except QueueFull as e:
        raise ServiceError(503, "overloaded", f"the server is busy: {e}", retry_after_s=e.retry_after_s) from None
    on_cancel(handle.cancel)
    gen = handle.tokens()
    try:
        return (yield from gen)
    except ContextTooLong as e:
        raise ServiceError(422, "context_too_long", str(e)) from e
    except PoolExhausted as e:
        raise ServiceError(503, "overloaded", f"the server is out of KV memory: {e}", retry_after_s=1.0) from None
    except Cancelled as e:
        if isinstance(e, RequestCancelled):
            raise
        raise RequestCancelled(e.what) from None
    finally:
        gen.close()


def answer_of(result: GenResult, tokenizer) -> Answer:
    """The :class:`Answer` of a finished scheduled request (timings in seconds from the plan's start)."""
    from kvlink_rag.decoding.answer import Answer
    from kvlink_rag.decoding.generate import answer_text

    t = result.timings
    return Answer(text=answer_text(tokenizer, result.token_ids),
                  token_ids=result.token_ids, ttft_s=t.get("ttft_s", t["total_s"]), total_s=t["total_s"],
                  context_tokens=result.prompt_tokens,
                  timings={"load_s": t.get("load_s", 0.0), "rope_s": 0.0, "link_forward_s": t.get("prefill_s", 0.0)},
                  finish_reason=result.finish_reason)


def stage_timings(plan, result: GenResult) -> dict[str, float]:
    """The query's stage timings (seconds from the plan's start) of a scheduled request."""
    t = result.timings
    end = time.perf_counter()
    return {"retrieval_s": plan.retrieval_s, "queue_wait_s": t.get("queue_wait_s", 0.0),
            "cache_load_s": t.get("load_s", 0.0), "link_s": t.get("prefill_s", 0.0),
            "ttft_s": t.get("ttft_s", end - plan.t0), "total_s": end - plan.t0}


def token_pieces(gen: Generator[int, None, GenResult], tokenizer, pieces: bool
                 ) -> Generator[tuple[str, object], None, GenResult]:
    """``("token", piece)`` for the text of a token-id generator (with ``pieces``); returns what it returns.
    When ``gen`` yields ``(id, TokenLogprob)`` pairs (the request asked for ``logprobs``), each token's
    ``("logprobs", TokenLogprob)`` comes before the piece its text ends up in. Closing this generator closes
    ``gen`` (the scheduled request is cancelled)."""
    from kvlink_rag.decoding.generate import whole_text

    ids: list[int] = []
    emitted = ""
    try:
        while True:
            try:
                item = next(gen)
            except StopIteration as stop:
                return stop.value
            if not pieces:
                continue
            if isinstance(item, tuple):
                item, lp = item
                yield "logprobs", lp
            ids.append(item)
            text = whole_text(tokenizer, ids)  # the rule of kvlink_rag.decoding.generate.stream_text
            if len(text) > len(emitted):
                yield "token", text[len(emitted):]
                emitted = text
    finally:
        gen.close()


def token_sources(result: GenResult, cache: RecordingCache) -> dict[str, int]:
    """Prompt tokens of a finished request by source: ``document_cache_tokens`` (documents served from their
    stored caches: memory tiers, local LMDB or the shared tier), ``shared_tier_tokens`` (those of them fetched
    from the shared tier: ``cache.from_shared`` of a :class:`store.recording_cache.RecordingCache`),
    ``encoded_tokens`` (documents encoded now) and ``prefix_tree_tokens`` (reused from the prefix tree)."""
    shared = cache.from_shared
    return {"document_cache_tokens": sum(result.hit_sizes.values()),
            "shared_tier_tokens": sum(n for key, n in result.hit_sizes.items() if key in shared),
            "encoded_tokens": result.encoded_tokens, "prefix_tree_tokens": result.tree_tokens}

"""An answer and the one decode-and-time loop that produces it (used by the engine, hence by the service,
the CLI, training's evaluation and the benchmarks)."""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field

from ..linking.context import LinkedContext
from ..model.loader import LoadedModel
from ..model.attention import capturing
from ..model.lora import forward_scope
from .generate import SamplingParams, answer_text, decode, stream_text


@dataclass
class Answer:
    """One generated answer.

    Attributes:
        text: decoded answer.
        token_ids: generated ids (stop token excluded).
        ttft_s: seconds from the call to the first token (cache load, RoPE, link forward, first sample).
        total_s: seconds for the whole call.
        cache_hits: documents served from the cache rather than encoded now.
        context_tokens: tokens in the prompt (prefix, documents, link tokens, question).
        timings: stage seconds (load_s, rope_s, link_forward_s).
        finish_reason: ``'stop'`` (end-of-turn token) or ``'length'`` (max_new_tokens or the model's
            context end).
    """

    text: str
    token_ids: list[int]
    ttft_s: float
    total_s: float
    cache_hits: int = 0
    context_tokens: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    finish_reason: str = "stop"



def generate_answer(lm: LoadedModel, adapter: str | None, ctx: LinkedContext, params: SamplingParams, t0: float,
                    hits: int = 0, pieces: bool = True) -> Generator[str, None, Answer]:
    """Decode from ``ctx`` under the query-side ``adapter`` (None: off), timing the first token and the whole.

    Yields the answer's text pieces as generated (nothing when ``pieces`` is False) and returns the
    :class:`Answer` (``yield from`` gives it; closing the generator early stops decoding).

    Args:
        ctx: a linked or fully prefilled context; its KV cache is extended in place.
        params: sampling parameters.
        t0: ``time.perf_counter()`` the answer's ``ttft_s`` and ``total_s`` count from (seconds).
        hits: documents served from the cache (reported in the Answer).
    """
    ids: list[int] = []
    first: list[float] = []

    def timed(tokens: Iterator[int]) -> Iterator[int]:
        for tok in tokens:
            if not first:
                first.append(time.perf_counter())
            ids.append(tok)
            yield tok

    with forward_scope(lm, adapter, capturing()):  # decode steps take transformers only under a capture (explain)
        tokens = timed(decode(lm, ctx, params))
        if pieces:
            yield from stream_text(lm.tokenizer, tokens)
        else:
            for _ in tokens:
                pass
    end = time.perf_counter()
    t = ctx.timings
    return Answer(text=answer_text(lm.tokenizer, ids), token_ids=ids,
                  ttft_s=(first[0] if first else end) - t0, total_s=end - t0, cache_hits=hits,
                  context_tokens=ctx.next_position,
                  timings={"load_s": t.load_s, "rope_s": t.rope_s, "link_forward_s": t.link_forward_s},
                  finish_reason=ctx.finish_reason or "length")


def run_to_end(gen: Generator[object, None, Answer]) -> Answer:
    """Exhaust ``gen`` (an :meth:`Engine.generate`-style generator) and return what it returns."""
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value

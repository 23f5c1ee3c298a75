"""The token budget of one scheduler step: chunked prefill mixed with decode.

Each step computes every running request's decode token and then chunks of the prefills still under way,
shortest remaining first, until the budget is spent (Sarathi-Serve, Agrawal et al., OSDI 2024; vLLM's
chunked prefill): a long prefill is spread over several steps beside the others' decode tokens instead
of stalling them for its whole length. A step in which some prefill completes (a short request's first
token is due) gives the long prefills (more tokens left than a whole budget) only :data:`MIN_CHUNK` tokens: the short request's
TTFT is then the time of a step of its own tokens, not of a full budget shared with a long prompt's chunk
(the long prompt loses part of one step per short arrival; it never stops).

A long prefill's chunk is also capped by its **cost** (vLLM's ``long_prefill_token_threshold``, weighted as
Sarathi-Serve weights its budget by the time a chunk takes): a token attends to every key before it, so a chunk
of ``n`` tokens after ``keys`` keys costs ``n * (1 + w * (keys + n / 2))`` token-equivalents, ``w`` being a key's
attention FLOPs over a token's linear FLOPs (:func:`key_weight`; 1/3,072 for SmolLM2-135M). A query arriving while a
long prompt runs waits for the step in flight, so that step's length (not its token count) is what it pays: with
the cap, a step at 3k keys holds half the tokens of one at the start.
"""

from __future__ import annotations

import math
from typing import Protocol

MIN_CHUNK = 16  # prefill tokens a step computes even when its decode tokens fill the budget (no starvation)


class Chunkable(Protocol):
    """What the budget reads of a running request."""

    @property
    def pending_left(self) -> int: ...  # tokens still to compute before it samples (1 while decoding)

    @property
    def context_keys(self) -> int: ...  # keys its next token attends to before its own (all its KV so far)

    @property
    def prefill_tokens(self) -> int: ...  # tokens of its current prefill, computed or not (1 while decoding)


def key_weight(lm) -> float:
    """A key's attention FLOPs for one query token over that token's linear FLOPs (one decoder layer).

    Attention costs ``4 * heads * head_dim`` FLOPs per (token, key) pair (``QK^T`` and ``PV``); the linears
    ``2 * (q, k, v, o and gated-MLP parameters)`` per token. On the development CPU both ran ~310 GFLOP/s
    (one forward of 16-256 prefill tokens at 0-3k keys: 40 ms a step + 0.68 ms a token x (1 + keys / 3,070)).

    Args:
        lm: the :class:`~kvlink_rag.model.loader.LoadedModel` (a Llama-family config and its ``head_dim``).
    Returns:
        ``w`` per key (dimensionless; 1/3,072 for SmolLM2-135M).
    """
    cfg, hd = lm.config, lm.head_dim
    heads, kv_heads, hidden = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
    params = hidden * hd * (2 * heads + 2 * kv_heads) + 3 * hidden * cfg.intermediate_size
    return 4 * heads * hd / (2 * params)


def tokens_for_cost(budget: float, keys: int, weight: float) -> int:
    """The most tokens (>= 1) whose chunk after ``keys`` keys costs at most ``budget`` token-equivalents:
    the largest ``n`` with ``n * (1 + weight * (keys + n / 2)) <= budget``."""
    if weight <= 0:
        return max(int(budget), 1)
    b = 1 + weight * keys  # n^2 * weight / 2 + n * b - budget <= 0
    return max(int((-b + math.sqrt(b * b + 2 * weight * budget)) / weight), 1)


def is_long(rr: Chunkable, max_step_tokens: int) -> bool:
    """Whether ``rr``'s prefill is a long one: more tokens than a step's budget, counted over the whole prefill, so
    its last chunks (fewer than a budget left, each after the most keys) keep the long-prefill cap: uncapped, a
    3.3k-token prompt's last 225 tokens took one 390 ms step."""
    return max(rr.pending_left, rr.prefill_tokens) > max_step_tokens


def allot(running: list[tuple[object, Chunkable]], max_step_tokens: int, long_prefill_budget: float | None = None,
          weight: float = 0.0) -> list[tuple[object, Chunkable, int]]:
    """``(handle, request, tokens)`` for each running request that computes this step.

    Args:
        running: ``(handle, request)`` pairs (:class:`Chunkable`).
        max_step_tokens: the step's budget: every decode token, then prefill chunks in the room left (at
            least :data:`MIN_CHUNK` prefill tokens, so decodes never starve a prefill), shortest remaining
            first; once one of them completes, those with more than a budget left get at most :data:`MIN_CHUNK`
            (other short prefills keep the room, so many short arrivals still complete several per step).
        long_prefill_budget: a long prefill (:func:`is_long`) computes at most this many token-equivalents a step
            (:func:`tokens_for_cost` at its keys), its last chunks too; None: no cap beyond the room.
        weight: :func:`key_weight` of the model (0: tokens counted alone).
    """
    live = [(h, rr) for h, rr in running if rr.pending_left > 0]
    decodes = [(h, rr, 1) for h, rr in live if rr.pending_left == 1]
    room = max(max_step_tokens - len(decodes), MIN_CHUNK)
    chunks, completing = [], False
    for h, rr in sorted((x for x in live if x[1].pending_left > 1), key=lambda x: x[1].pending_left):
        if room <= 0:
            break
        n = min(rr.pending_left, room)
        if is_long(rr, max_step_tokens):
            if completing:  # a long prompt beside a completing one: a small chunk
                n = min(n, MIN_CHUNK)
            elif long_prefill_budget is not None:
                n = min(n, max(tokens_for_cost(long_prefill_budget, rr.context_keys, weight), MIN_CHUNK))
        completing = completing or n == rr.pending_left
        chunks.append((h, rr, n))
        room -= n
    return decodes + chunks

"""The token budget of one scheduler step: chunked prefill mixed with decode.

Each step computes every running request's decode token and then chunks of the prefills still under way,
shortest remaining first, until the budget is spent (Sarathi-Serve, Agrawal et al., OSDI 2024; vLLM's
chunked prefill): a long prefill is spread over several steps beside the others' decode tokens instead
of stalling them for its whole length. A step in which some prefill completes (a short request's first
token is due) gives the long prefills (more tokens left than a whole budget) only :data:`MIN_CHUNK` tokens: the short request's
TTFT is then the time of a step of its own tokens, not of a full budget shared with a long prompt's chunk
(the long prompt loses part of one step per short arrival; it never stops).
"""

from __future__ import annotations

MIN_CHUNK = 16  # prefill tokens a step computes even when its decode tokens fill the budget (no starvation)


def allot(running: list[tuple[object, object]], max_step_tokens: int) -> list[tuple[object, object, int]]:
    """``(handle, request, tokens)`` for each running request that computes this step.

    Args:
        running: ``(handle, RunningRequest)`` pairs; a request's ``pending_left`` is the tokens it still
            has to compute before it samples (1 while decoding).
        max_step_tokens: the step's budget: every decode token, then prefill chunks in the room left (at
            least :data:`MIN_CHUNK` prefill tokens, so decodes never starve a prefill), shortest remaining
            first; once one of them completes, those with more than a budget left get at most :data:`MIN_CHUNK`
            (other short prefills keep the room, so many short arrivals still complete several per step).
    """
    live = [(h, rr) for h, rr in running if rr.pending_left > 0]
    decodes = [(h, rr, 1) for h, rr in live if rr.pending_left == 1]
    room = max(max_step_tokens - len(decodes), MIN_CHUNK)
    chunks, completing = [], False
    for h, rr in sorted((x for x in live if x[1].pending_left > 1), key=lambda x: x[1].pending_left):
        if room <= 0:
            break
        n = min(rr.pending_left, room)
        if completing and rr.pending_left > max_step_tokens:  # a long prompt beside a completing one: a small chunk
            n = min(n, MIN_CHUNK)
        completing = completing or n == rr.pending_left
        chunks.append((h, rr, n))
        room -= n
    return decodes + chunks

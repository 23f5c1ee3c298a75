"""Stop strings on a query's events: the text a client sees ends before the first stop string.

Generation itself ends with the token completing a stop string (the decode loops' hook,
:class:`kvlink_rag.decoding.stop_strings.StopStrings`); here the streamed pieces hold back what might begin a stop
string, and the final answer is decoded again and cut (:func:`kvlink_rag.decoding.stop_strings.cut`).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

from kvlink_rag.decoding.stop_strings import StopFilter, cut


def stopped_events(events: Generator[tuple[str, object], None, None], stops: tuple[str, ...], tokenizer
                   ) -> Iterator[tuple[str, object]]:
    """``events`` (``("token", piece)``..., ``("done", QueryResult)``) with ``stops`` applied to the pieces
    and to the result's ``answer``. Closing this generator closes ``events`` (generation is cancelled)."""
    f = StopFilter(stops)
    try:
        for kind, value in events:
            if kind == "logprobs":  # a token's log-probabilities (its text is cut below, they are not)
                yield kind, value
                continue
            if kind == "token":
                out = f.feed(value)
                if out:
                    yield kind, out
                continue
            tail = f.flush()
            if tail:
                yield "token", tail
            value.answer = cut(tokenizer.decode(value.token_ids, skip_special_tokens=True), stops).strip()
            yield kind, value
    finally:
        events.close()

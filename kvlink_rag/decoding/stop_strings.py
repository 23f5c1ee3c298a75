"""Stop strings (OpenAI's ``stop``): generation ends once the decoded answer contains one of them, and the
stop text itself is never part of the answer.

Two halves that agree on where an answer stops:

* :class:`StopStrings` is the decode loops' hook: fed each generated token id, it says whether the text
  decoded so far now contains a stop string (it decodes only a window of the last tokens, so a step
  costs the same however long the answer is). The token that completes a stop string is the last one
  generated (and counted as a completion token, as in vLLM).
* :func:`cut` and :class:`StopFilter` shape the text a client sees: the answer up to the first stop
  string; while streaming, the filter holds back a tail that might be the start of a stop string, and
  lets it go once it cannot be (or when the answer ends without one).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


def normalize_stop(stop: str | Iterable[str] | None) -> tuple[str, ...]:
    """``stop`` as a tuple of distinct strings (a string is one stop string; None, ``""`` and ``[]`` none).

    Raises:
        ValueError: an empty string in a list, more than :data:`MAX_STOP_STRINGS` strings, or one over
            :data:`MAX_STOP_CHARS` characters.
    """
    if stop is None or stop == "":
        return ()
    items = [stop] if isinstance(stop, str) else list(stop)
    if any(not isinstance(s, str) for s in items):
        raise ValueError("stop must be a string or a list of strings")
    if any(s == "" for s in items):
        raise ValueError("stop strings must not be empty")
    if len(items) > MAX_STOP_STRINGS:
        raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings; got {len(items)}")
    if any(len(s) > MAX_STOP_CHARS for s in items):
        raise ValueError(f"a stop string has at most {MAX_STOP_CHARS} characters")
    return tuple(dict.fromkeys(items))


def first_stop(text: str, stops: tuple[str, ...], start: int = 0) -> int | None:
    """Index in ``text`` where the earliest stop string begins (searching from ``start``), or None."""
    found = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(found) if found else None


def cut(text: str, stops: tuple[str, ...]) -> str:
    """``text`` up to (not including) its first stop string; ``text`` itself when it has none."""
    i = first_stop(text, stops) if stops else None
    return text if i is None else text[:i]


class StopStrings:
    """Per-request hook of a decode loop: :meth:`push` each generated id; True once a stop string appeared.

    Args:
        tokenizer: decodes ids (special tokens skipped, as the answer's text is decoded).
        stops: the stop strings (non-empty).
    """

    def __init__(self, tokenizer, stops: tuple[str, ...]):
        self.tokenizer, self.stops = tokenizer, stops
        # a character may take up to 4 byte-level tokens, and skipped special tokens decode to nothing
        self.window = 4 * max(len(s) for s in stops) + 8
        self.ids: list[int] = []

    @classmethod
    def of(cls, tokenizer, stops: tuple[str, ...]) -> StopStrings | None:
        """A hook for ``stops``, or None without stop strings (the loop skips the check)."""
        return cls(tokenizer, stops) if stops else None

    def push(self, token_id: int) -> bool:
        """Record ``token_id``; whether the decoded text now contains a stop string."""
        self.ids.append(int(token_id))
        tail = self.tokenizer.decode(self.ids[-self.window:], skip_special_tokens=True)
        return first_stop(tail, self.stops) is not None


class StopFilter:
    """Streamed text pieces with stop strings applied: :meth:`feed` each piece, then :meth:`flush`.

    What is returned never contains a stop string nor anything after one; a tail that could begin one is
    held back until the next piece settles it.
    """

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.held = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        """The text that can be sent now (possibly ``""``)."""
        if self.stopped:
            return ""
        text = self.held + piece
        i = first_stop(text, self.stops)
        if i is not None:
            self.stopped, self.held = True, ""
            return text[:i]
        keep = max((n for s in self.stops for n in range(min(len(s) - 1, len(text)), 0, -1)
                    if text.endswith(s[:n])), default=0)
        self.held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The held-back tail once the answer ended without completing a stop string."""
        held, self.held = self.held, ""
        return "" if self.stopped else held


def filter_pieces(pieces: Iterable[str], stops: tuple[str, ...]) -> Iterator[str]:
    """``pieces`` through a :class:`StopFilter` (empty pieces dropped)."""
    f = StopFilter(stops)
    for piece in pieces:
        out = f.feed(piece)
        if out:
            yield out
    tail = f.flush()
    if tail:
        yield tail

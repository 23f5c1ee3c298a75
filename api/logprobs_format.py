"""OpenAI's ``logprobs`` objects of generated tokens (:class:`kvlink_rag.decoding.logprobs.TokenLogprob`: raw model
log-softmax, vLLM's default), for chat (``choices[i].logprobs.content``) and legacy completions
(``tokens`` / ``token_logprobs`` / ``top_logprobs`` / ``text_offset``), whole or one stream chunk at a time.

Every generated token is listed, also the one that completed a stop string (whose text is cut from the
answer); a token holding part of a multi-byte character has that part's bytes (``bytes``) and U+FFFD in its
``token`` text.
"""

from __future__ import annotations

from collections.abc import Sequence

from service.core_types import TokenLogprob, token_bytes


class LogprobsFormat:
    """Builds the ``logprobs`` of one request's choices; ``chat`` picks the wire shape. Completions'
    ``text_offset`` counts characters of the tokens' texts from the start of each choice's completion (kept
    per choice across stream chunks)."""

    def __init__(self, tokenizer, chat: bool):
        self.tokenizer, self.chat = tokenizer, chat
        self._offsets: dict[int, int] = {}

    def _text(self, token_id: int) -> tuple[str, list[int]]:
        raw = token_bytes(self.tokenizer, token_id)
        return raw.decode("utf-8", errors="replace"), list(raw)

    def of(self, entries: Sequence[TokenLogprob], index: int = 0) -> dict:
        """The ``logprobs`` object of ``entries`` (the next tokens of choice ``index``)."""
        return self._chat(entries) if self.chat else self._completion(entries, index)

    def _chat(self, entries: Sequence[TokenLogprob]) -> dict:
        content = []
        for e in entries:
            text, raw = self._text(e.token_id)
            tops = []
            for tid, lp in e.top:
                t, b = self._text(tid)
                tops.append({"token": t, "logprob": lp, "bytes": b})
            content.append({"token": text, "logprob": e.logprob, "bytes": raw, "top_logprobs": tops})
        return {"content": content, "refusal": None}

    def _completion(self, entries: Sequence[TokenLogprob], index: int) -> dict:
        out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        offset = self._offsets.get(index, 0)
        for e in entries:
            text = self._text(e.token_id)[0]
            tops = {self._text(tid)[0]: lp for tid, lp in e.top}
            tops.setdefault(text, e.logprob)  # vLLM's: the sampled token is in its top_logprobs too
            out["tokens"].append(text)
            out["token_logprobs"].append(e.logprob)
            out["top_logprobs"].append(tops)
            out["text_offset"].append(offset)
            offset += len(text)
        self._offsets[index] = offset
        return out

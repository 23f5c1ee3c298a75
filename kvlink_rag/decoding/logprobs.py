"""Log-probabilities of sampled tokens (OpenAI's ``logprobs`` / ``top_logprobs``), from the logits the decode
step already computed (no extra forward).

The values are vLLM's default (``logprobs_mode="raw_logprobs"``): ``log_softmax`` of the model's raw logits,
before temperature, top-p, the ``min_tokens`` mask or a grammar mask. For greedy decoding that is the
distribution the token was picked from; for sampling it is the model's own distribution, not the tempered one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for chat (completions: 5)


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability and the most likely alternatives at its position.

    Attributes:
        token_id: the generated token.
        logprob: its natural-log probability (float, <= 0) under the raw model distribution.
        top: ``(token id, logprob)`` of the ``n`` most likely tokens, most likely first (``n`` as asked, 0..20).
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprob(logits: torch.Tensor, token_id: int, top: int) -> TokenLogprob:
    """The :class:`TokenLogprob` of ``token_id`` from ``[vocab]`` float logits (any dtype; computed in float32).

    Args:
        top: how many alternatives (0..:data:`MAX_TOP_LOGPROBS`).
    Raises:
        ValueError: ``top`` out of range.
    """
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top_logprobs must be within 0..{MAX_TOP_LOGPROBS}, got {top}")
    lp = torch.log_softmax(logits.detach().float().reshape(-1), dim=-1)
    alts: tuple[tuple[int, float], ...] = ()
    if top:
        vals, ids = torch.topk(lp, top)
        alts = tuple(zip(ids.tolist(), vals.tolist()))
    return TokenLogprob(int(token_id), float(lp[token_id]), alts)


def token_bytes(tokenizer, token_id: int) -> bytes:
    """The UTF-8 bytes a token stands for: a byte-level BPE token (GPT-2 style, SmolLM2's) mapped back through
    its byte alphabet, so a token holding part of a character gives its real bytes; otherwise its decoded text."""
    piece = tokenizer.convert_ids_to_tokens(int(token_id))
    table = _byte_decoder()
    if isinstance(piece, str) and piece and all(c in table for c in piece):
        return bytes(table[c] for c in piece)
    return tokenizer.decode([int(token_id)]).encode("utf-8")


_BYTE_DECODER: dict[str, int] | None = None


def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable-character alphabet of the 256 byte values, inverted (character -> byte)."""
    global _BYTE_DECODER
    if _BYTE_DECODER is None:
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
        cs = bs[:]
        n = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        _BYTE_DECODER = {chr(c): b for b, c in zip(bs, cs)}
    return _BYTE_DECODER

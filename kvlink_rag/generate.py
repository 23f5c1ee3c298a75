"""Prefill, decode and token streaming over a prepared KV cache (greedy or temperature/top-p sampling)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from .model import LoadedModel
from .types import LinkedContext, Segment, Timings

END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "</s>")


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings.

    Attributes:
        max_new_tokens: generation budget in tokens (>= 1).
        temperature: 0 for greedy; otherwise logits are divided by it before sampling.
        top_p: nucleus sampling mass in (0, 1] (Holtzman et al., 2020).
        seed: seed of the sampling generator (None: nondeterministic).
        stop_token_ids: generation ends after any of these (not included in the text).
    """

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = 0
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")


def stop_token_ids(tokenizer) -> tuple[int, ...]:
    """EOS and the chat template's end-of-turn tokens present in the vocabulary."""
    vocab = tokenizer.get_vocab()
    ids = {vocab[t] for t in END_OF_TURN_TOKENS if t in vocab}
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return tuple(sorted(ids))


def sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Pick the next token id from ``[vocab]`` float logits (greedy when temperature is 0)."""
    if params.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, idx = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < params.top_p
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter_(0, idx, sorted_p)
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


@torch.no_grad()
def full_prefill(lm: LoadedModel, ids: torch.Tensor) -> LinkedContext:
    """Ordinary causal prefill of ``[tokens]`` int64 ids at positions ``0..n-1`` (the baseline).

    Raises:
        ValueError: empty input or longer than the model's context.
    """
    n = int(ids.numel())
    if n == 0 or n > lm.max_positions:
        raise ValueError(f"prompt of {n} tokens is empty or exceeds the model's {lm.max_positions}")
    t0 = time.perf_counter()
    pos = torch.arange(n)
    out = lm.model(input_ids=ids.to(lm.device)[None], position_ids=pos.to(lm.device)[None],
                   cache=DynamicCache(), use_cache=True, logits_to_keep=1)
    timings = Timings(link_forward_s=time.perf_counter() - t0)
    return LinkedContext(cache=out.cache, segments=[Segment("question", -1, 0, n)], storage_positions=pos,
                         next_position=n, last_logits=out.logits[0, -1].float(), timings=timings)


@torch.no_grad()
def decode(lm: LoadedModel, ctx: LinkedContext, params: SamplingParams) -> Iterator[int]:
    """Yield generated token ids, the first from ``ctx.last_logits``, then one decode step each.

    The cache in ``ctx`` is extended in place. Stops at a stop token (not yielded) or after
    ``max_new_tokens``.
    """
    gen = None
    if params.temperature > 0:
        gen = torch.Generator(device="cpu")
        gen.manual_seed(params.seed) if params.seed is not None else gen.seed()
    logits, pos = ctx.last_logits, ctx.next_position
    for step in range(params.max_new_tokens):
        tok = sample_next(logits.cpu(), params, gen)
        if tok in params.stop_token_ids:
            return
        yield tok
        if step + 1 == params.max_new_tokens:
            return
        out = lm.model(input_ids=torch.tensor([[tok]], device=lm.device),
                       position_ids=torch.tensor([[pos]], device=lm.device),
                       cache=ctx.cache, use_cache=True, logits_to_keep=1)
        logits, pos = out.logits[0, -1].float(), pos + 1


def stream_text(tokenizer, token_ids: Iterator[int]) -> Iterator[str]:
    """Turn a token-id stream into text pieces (decodes the running sequence so multi-byte chars stay whole)."""
    ids: list[int] = []
    emitted = ""
    for tok in token_ids:
        ids.append(tok)
        text = tokenizer.decode(ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            continue
        if len(text) > len(emitted):
            yield text[len(emitted):]
            emitted = text

"""Prefill, decode and token streaming over a prepared KV cache (greedy or temperature/top-p sampling)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from ..linking.context import LinkedContext, Segment, Timings
from ..model.attention import capturing
from ..model.loader import LoadedModel
from ..runtime.hf_cache import cache_view, prefill, runs_on_runner, sequence_from_cache
from ..runtime.ragged import SequenceKV
from ..types import ContextTooLong
from .stop_strings import StopStrings

if TYPE_CHECKING:
    from .grammar import Grammar

GREEDY_BELOW = 1e-5  # temperatures below this decode greedily (vLLM's _SAMPLING_EPS)
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "</s>")


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings.

    Attributes:
        max_new_tokens: generation budget in tokens (>= 1).
        temperature: 0 for greedy; otherwise logits are divided by it before sampling. Below
            :data:`GREEDY_BELOW` (1e-5, vLLM's threshold) decoding is greedy too: dividing float32 logits
            by a smaller temperature overflows (a temperature of 1e-300 is 0 in float32).
        top_p: nucleus sampling mass in (0, 1] (Holtzman et al., 2020); the most likely token is always in
            the nucleus, so a ``top_p`` below its probability (even below float32 resolution) samples it.
        seed: seed of the sampling generator (None, the default: nondeterministic, a fresh seed per request,
            as OpenAI's API and vLLM do); used only when sampling (temperature >= 1e-5).
        stop_token_ids: generation ends after any of these (not included in the text).
        min_tokens: the stop tokens cannot be sampled before this many tokens were generated (vLLM's).
        stop: stop strings (:mod:`kvlink_rag.decoding.stop_strings`): generation ends with the token completing one.
        logprobs: None (not asked), else how many most likely alternatives (0..20) to report with each
            generated token's log-probability (:mod:`kvlink_rag.decoding.logprobs`: raw model log-softmax, vLLM's default).
            Batching scheduler only (:class:`kvlink_rag.runtime.running.RunningRequest`).
        grammar: a compiled :class:`kvlink_rag.decoding.grammar.Grammar` the answer must follow (``response_format``):
            each request masks its logits with its own matcher before sampling. Batching scheduler only.
    """

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    grammar: Grammar | None = None

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")

    @property
    def greedy(self) -> bool:
        """Whether decoding is greedy (temperature below :data:`GREEDY_BELOW`): no generator, no seed used."""
        return self.temperature < GREEDY_BELOW


def sampling_generator(params: SamplingParams) -> torch.Generator | None:
    """The CPU generator sampling draws from: seeded with ``params.seed``, freshly seeded without one,
    None when decoding is greedy."""
    if params.greedy:
        return None
    gen = torch.Generator(device="cpu")
    if params.seed is not None:
        gen.manual_seed(params.seed)
    else:
        gen.seed()
    return gen


def stop_token_ids(tokenizer) -> tuple[int, ...]:
    """EOS and the chat template's end-of-turn tokens present in the vocabulary."""
    vocab = tokenizer.get_vocab()
    ids = {vocab[t] for t in END_OF_TURN_TOKENS if t in vocab}
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return tuple(sorted(ids))


def sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
                generated: int = 0) -> int:
    """Pick the next token id from ``[vocab]`` float logits (greedy when ``params.greedy``); the nucleus of
    ``top_p`` always holds the most likely token; while fewer than ``params.min_tokens`` tokens were
    ``generated``, the stop tokens are excluded."""
    if generated < params.min_tokens and params.stop_token_ids:
        logits = logits.clone()
        logits[list(params.stop_token_ids)] = float("-inf")
    if params.greedy:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, idx = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < params.top_p
        keep[0] = True
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter_(0, idx, sorted_p)
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


@torch.no_grad()
def full_prefill(lm: LoadedModel, ids: torch.Tensor, new_tokens: int = 1) -> LinkedContext:
    """Ordinary causal prefill of ``[tokens]`` int64 ids at positions ``0..n-1`` (the baseline), through the
    model runner in chunks (through transformers where gradients or an attention capture need it).

    Args:
        new_tokens: positions that must stay free after the prompt (1: room for at least one new token).
    Raises:
        ValueError: empty input.
        ContextTooLong: ``n + new_tokens`` exceeds the model's context (``max_position_embeddings``).
    """
    n = int(ids.numel())
    if n == 0:
        raise ValueError("prompt is empty (0 tokens)")
    if n + new_tokens > lm.max_positions:
        raise ContextTooLong(f"prompt of {n} tokens plus {new_tokens} new token(s) exceeds the model's context of "
                             f"{lm.max_positions} positions")
    t0 = time.perf_counter()
    pos = torch.arange(n)
    if runs_on_runner():
        cfg = lm.config
        seq = SequenceKV([], lm.num_layers, cfg.num_key_value_heads, lm.head_dim, lm.kv_dtype, lm.device,
                         n + new_tokens)
        last = prefill(lm, seq, lm.embed_tokens(ids.to(lm.device)), pos.to(lm.device))
        cache = cache_view(seq)
    else:
        out = lm.model(input_ids=ids.to(lm.device)[None], position_ids=pos.to(lm.device)[None],
                       cache=DynamicCache(), use_cache=True, logits_to_keep=1)
        cache, last = out.cache, out.logits[0, -1].float()
    timings = Timings(link_forward_s=time.perf_counter() - t0)
    return LinkedContext(cache=cache, segments=[Segment("question", -1, 0, n)], storage_positions=pos,
                         next_position=n, last_logits=last, timings=timings)


@torch.no_grad()
def decode(lm: LoadedModel, ctx: LinkedContext, params: SamplingParams) -> Iterator[int]:
    """Yield generated token ids, the first from ``ctx.last_logits``, then one decode step each.

    Each step is a one-token forward of the model runner (:mod:`kvlink_rag.runtime`) over the context's KV,
    copied once from ``ctx.cache``; while an attention capture is open on this thread (explain,
    :func:`kvlink_rag.model.attention.capturing`) the steps run through transformers instead, extending
    ``ctx.cache`` in place, so the capture's hooks see them. Stops at a stop token (not yielded;
    ``ctx.finish_reason`` ``'stop'``; also after the token completing a stop string), after
    ``max_new_tokens``, or at the model's context end (``'length'`` for both): prompt plus generated tokens
    never exceed ``max_position_embeddings``, so no position ``>= max_positions`` is ever fed (the last token
    yielded is not fed at all).
    """
    gen = sampling_generator(params)
    logits, pos = ctx.last_logits, ctx.next_position
    budget = min(params.max_new_tokens, lm.max_positions - pos)  # tokens that still get a position
    ctx.finish_reason = "length"
    step_fn = _transformers_step(lm, ctx) if capturing() else _runner_step(lm, ctx, budget)
    stops = StopStrings.of(lm.tokenizer, params.stop)
    for step in range(budget):
        tok = sample_next(logits.cpu(), params, gen, step)
        if tok in params.stop_token_ids:
            ctx.finish_reason = "stop"
            return
        yield tok
        if stops is not None and stops.push(tok):
            ctx.finish_reason = "stop"
            return
        if step + 1 == budget:
            return
        logits, pos = step_fn(tok, pos), pos + 1


def _runner_step(lm: LoadedModel, ctx: LinkedContext, budget: int):
    """``step(token, position) -> [vocab]`` float32 logits: one one-token forward of the runner."""
    seq = sequence_from_cache(lm, ctx.cache, budget)

    def step(tok: int, pos: int) -> torch.Tensor:
        embeds = lm.embed_tokens(torch.tensor([tok], device=lm.device))
        return prefill(lm, seq, embeds, torch.tensor([pos], device=lm.device))
    return step


def _transformers_step(lm: LoadedModel, ctx: LinkedContext):
    """``step(token, position) -> [vocab]`` float32 logits through transformers (``ctx.cache`` extended)."""
    def step(tok: int, pos: int) -> torch.Tensor:
        out = lm.model(input_ids=torch.tensor([[tok]], device=lm.device),
                       position_ids=torch.tensor([[pos]], device=lm.device),
                       cache=ctx.cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1].float()
    return step


def whole_text(tokenizer, ids: list[int]) -> str:
    """The text of ``ids`` up to the last whole character: the one decoding rule of streamed pieces and of
    the final answer. A character whose bytes the ids end inside (decoded as trailing U+FFFD: generation
    stopped mid-character, or the stream has not seen its last byte yet) is left out."""
    return tokenizer.decode(ids, skip_special_tokens=True).rstrip("\ufffd")


def answer_text(tokenizer, ids: list[int]) -> str:
    """The final answer of generated ``ids``: :func:`whole_text`, stripped; equals the joined pieces of
    :func:`stream_text`, stripped."""
    return whole_text(tokenizer, ids).strip()


def stream_text(tokenizer, token_ids: Iterator[int]) -> Iterator[str]:
    """Turn a token-id stream into text pieces: each piece is what :func:`whole_text` of the ids so far adds
    (multi-byte characters stay whole; one cut off by the end of generation is never sent)."""
    ids: list[int] = []
    emitted = ""
    for tok in token_ids:
        ids.append(tok)
        text = whole_text(tokenizer, ids)
        if len(text) > len(emitted):
            yield text[len(emitted):]
            emitted = text

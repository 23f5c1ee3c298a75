"""A request inside the batching scheduler: its prompt layout, prefix-tree match, KV and sampling state.

:func:`kvlink_rag.runtime.admit.admit` builds it (layout, longest stored prefix, the cached KV appended, the prefill left to
compute); the scheduler then packs :meth:`RunningRequest.next_inputs` of many requests into one
:class:`~kvlink_rag.runtime.ragged.RaggedBatch` forward and hands each its logits with :meth:`RunningRequest.step`.
Token choice, budget and stop rules are those of :func:`kvlink_rag.decoding.generate.decode` (the same tokens for
the same logits and seed): the first token comes from the prefill's logits, each later one from a
one-token decode, and the last token sampled is never fed.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from ..decoding.generate import SamplingParams, sample_next, sampling_generator
from ..decoding.logprobs import TokenLogprob, token_logprob
from ..decoding.stop_strings import StopStrings
from ..engine import Engine
from ..explain.attention_rows import RowAttention
from ..linking.context import LinkedContext, Timings
from .prefix_tree import Match, PrefixTree
from .ragged import mask_rows
from .request_layout import PendingPrefill, RequestLayout, new_sequence, prepare_tokens


class RunningRequest:
    """State of one admitted request (see module docstring).

    Attributes:
        engine: the request's engine (adapter, link tokens, cache view).
        context: prefix-tree root key (mode, adapter, link tokens, K, encoding fingerprint).
        layout: items in storage order (grows with fed tokens).
        prompt_items: items of the prompt (before generation).
        seq: the KV (shared chunks, then own tokens).
        pending: inputs of the next forward (prefill, then one token per decode step), None when done.
        tokens: generated ids; finish_reason once finished.
        tree_tokens, tree_docs: what the prefix tree served.
        encoded_tokens: tokens of documents encoded now (cache misses).
        hit_sizes: cache key -> tokens of each document served from its stored cache (per-request accounting).
        cached_tokens: prompt tokens not computed for this request (prefix tree, prefix KV, stored caches).
        context_tokens: positions the prompt spans (retention's dropped tokens count).
        own_prompt: the prompt's KV stays the request's own (not put in the tree): retention, CacheBlend, explain.
        fixup: the reuse method's :class:`~kvlink_rag.reuse.methods.Fixup` (CacheBlend's fresh KV in place), applied
            once the prefill is complete, or None.
        attention: explain's :class:`~kvlink_rag.explain.attention_rows.RowAttention`, handed to the runner with each row.
        cold: computed without the prefix tree (mode ``full`` with documents, the comparison): nothing is
            read from it and its KV is not inserted.
    """

    def __init__(self, engine: Engine, context: Hashable, layout: RequestLayout, params: SamplingParams,
                 tree: PrefixTree):
        self.engine, self.context, self.layout, self.params, self.tree = engine, context, layout, params, tree
        self.prompt_items = len(layout.items)
        self.prompt_tokens = layout.num_tokens
        self.match: Match | None = None
        self.seq = None
        self.pending: PendingPrefill | None = None
        self.fed = 0  # tokens of ``pending`` already computed (chunked prefill)
        self.tokens: list[int] = []
        self.finish_reason: str | None = None
        self.tree_tokens, self.tree_docs = 0, set()
        self.encoded_tokens = self.cached_tokens = 0
        self.hit_sizes: dict[str, int] = {}
        self.shared = False
        self.cold = False
        self.logits: list[torch.Tensor] | None = None  # [vocab] float32 per step, when kept (verification)
        self.last_layer_kv: tuple[torch.Tensor, torch.Tensor] | None = None  # with logits: the prompt's last layer
        self.generator = sampling_generator(params)
        self.budget = min(params.max_new_tokens, engine.lm.max_positions - layout.next_position)
        self.stops = StopStrings.of(engine.lm.tokenizer, params.stop)  # None without stop strings
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None
        self.matcher = params.grammar.matcher() if params.grammar is not None else None  # its own grammar state
        self.timings = {"load_s": 0.0, "prefill_s": 0.0}
        self.context_tokens = layout.next_position  # positions the prompt spans (retention: kept or not)
        self.own_prompt = False  # keep the prompt's KV to itself (retention, CacheBlend, explain: see admit)
        self.prompt_in_tree = False  # the prompt's KV was put in the prefix tree (its answer goes after it)
        self.fixup = None  # CacheBlend: fresh KV to put in place once the prefill is complete
        self.attention = None  # explain: kvlink_rag.explain.attention_rows.RowAttention over the answer's rows

    @property
    def adapter(self) -> str | None:
        return self.engine.adapter

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def pending_left(self) -> int:
        """Tokens of :attr:`pending` not yet computed (0 when finished)."""
        return 0 if self.pending is None else self.pending.num_tokens - self.fed

    @property
    def prefill_tokens(self) -> int:
        """Tokens of :attr:`pending`, computed or not (the whole prefill being chunked; 1 while decoding)."""
        return 0 if self.pending is None else self.pending.num_tokens

    @property
    def context_keys(self) -> int:
        """Keys its next token attends to before its own: every token of its KV so far (shared and own)."""
        return 0 if self.seq is None else self.seq.num_tokens

    def next_chunk(self, n: int) -> PendingPrefill:
        """The next ``n`` (at most :attr:`pending_left`) tokens of :attr:`pending` to compute, with their rows of
        its mask over every key up to the chunk's last token (chunked prefill: the same attention as one
        forward of the whole prefill, split across steps). :meth:`step` is called after the last chunk."""
        p, a = self.pending, self.fed
        b = min(p.num_tokens, a + n)
        self.fed = b
        if self.attention is not None:
            self.attention.chunk(a, b)
        return PendingPrefill(p.embeds[a:b], p.positions[a:b], mask_rows(p.mask, a, b))

    def step(self, logits: torch.Tensor) -> int | None:
        """Take the ``[vocab]`` logits after the last fed token; returns the token to emit (None when the
        request ended on a stop token). Sets :attr:`pending` to the token to feed, or finishes. With a grammar
        the logits are masked by the request's matcher before sampling (greedy or sampled); with ``logprobs``
        the emitted token's :class:`~kvlink_rag.decoding.logprobs.TokenLogprob` (of the unmasked logits) is appended to
        :attr:`logprobs`."""
        if self.fixup is not None:  # the reuse method's fixup (CacheBlend: recomputed tokens' KV into their slots)
            self.fixup.apply(self.seq)
            self.fixup = None
        if self.logits is not None:
            self.logits.append(logits.detach().clone())
            if not self.shared:  # the prompt's last-layer KV, storage order: [kv_heads, prompt_tokens, head_dim]
                last = self.engine.lm.num_layers - 1
                pieces = list(self.seq.layer_kv(last))
                self.last_layer_kv = (torch.cat([k for k, _ in pieces], 1).clone(), torch.cat([v for _, v in pieces], 1).clone())
        if not self.shared:
            self.shared = True
            if self.attention is not None:
                self.attention.prompt_done()
            if not self.own_prompt and not self.cold:
                self._share_prompt()
        self.fed = 0
        masked = logits if self.matcher is None else self.matcher.mask(logits)
        tok = sample_next(masked, self.params, self.generator, len(self.tokens))
        if self.matcher is not None:
            self.matcher.accept(tok)
        if tok in self.params.stop_token_ids:
            self.finish_reason, self.pending = "stop", None
            return None
        self.tokens.append(tok)
        if self.logprobs is not None:  # of the raw logits (vLLM's default), before any mask
            self.logprobs.append(token_logprob(logits, tok, self.params.logprobs))
        if self.stops is not None and self.stops.push(tok):
            self.finish_reason, self.pending = "stop", None
        elif self.matcher is not None and self.matcher.finished:
            self.finish_reason, self.pending = "stop", None
        elif len(self.tokens) >= self.budget:
            self.finish_reason, self.pending = "length", None
        else:
            self.pending = prepare_tokens(self.engine.lm, [tok], self.layout.next_position)
            self.layout.append_text(tok)
        return tok

    def _share_prompt(self) -> None:
        """After the prefill: put the prompt's KV in the tree. The tree takes views of this request's buffers
        (nothing copied) and the request decodes on in them; when the tree already held the whole prompt
        (a concurrent request's), the request reads it from there instead and drops its own copy, so
        concurrent requests with the same prompt hold it once."""
        seq, n_items = self.seq, self.prompt_items
        start = self.match.tokens - seq.shared_tokens  # own tokens copied from the match (new_sequence)
        own = seq.lend(start, seq.length)  # its blocks: the tree takes references, nothing is copied
        stored = self.tree.insert(self.context, self.layout.items[:n_items], self.layout.sizes[:n_items], own,
                                  kv_from=self.match.items)
        self.prompt_in_tree = True
        if stored:
            seq.lent = seq.length - start
            return
        again = self.tree.match(self.context, self.layout.items[:n_items])
        if again.tokens == self.prompt_tokens:
            self.tree.release(self.match)
            self.match = again
            seq.release()
            self.seq = new_sequence(self.engine.lm, again.chunks, max(self.budget, 1))
        else:
            self.tree.release(again)
            self.prompt_in_tree = False

    def explained(self) -> tuple | None:
        """With explain: ``(AttentionMass, LinkedContext)``, the mass collected and a context holding the
        prompt's layout (segments, ``[prompt slots]`` storage positions; no cache) for
        :func:`kvlink_rag.explain.answers.attribution`; else None."""
        if self.attention is None:
            return None
        lay = self.layout
        ctx = LinkedContext(cache=None, segments=lay.segments, storage_positions=lay.storage_positions(0, self.prompt_items),
                            next_position=self.context_tokens, last_logits=torch.zeros(0), timings=Timings())
        return self.attention.mass, ctx

    def finish(self) -> None:
        """Store the fed generated tokens' KV in the tree (the next turn of a chat finds them) and unpin."""
        if self.match is None:
            return
        seq = self.seq
        fed = len(self.layout.items)
        start = self.prompt_tokens - seq.shared_tokens  # own tokens of the prompt (before the answer's)
        if self.prompt_in_tree and seq.length > start and not self.cold:
            own = seq.lend(start, seq.length)  # the answer's blocks, referenced by the tree
            self.tree.insert(self.context, self.layout.items[:fed], self.layout.sizes[:fed], own,
                             kv_from=self.prompt_items)
        self.tree.release(self.match)
        self.match = None
        seq.release()  # blocks the tree took references to stay

"""What a front end hands the scheduler, and the handle it reads the answer from.

A :class:`GenRequest` names the prompt (documents and the question or conversation ids, linked or
full), the adapter's engine and the sampling parameters; :class:`RequestHandle` yields the generated
token ids as they are sampled and ends with a :class:`GenResult` (or raises what failed the request).
Closing the handle early (client gone) cancels the request: the scheduler frees its slot before its
next step.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .cancel import Cancelled

if TYPE_CHECKING:
    from kvlink_rag.decoding.generate import SamplingParams
    from kvlink_rag.decoding.logprobs import TokenLogprob
    from kvlink_rag.engine import Engine
    from kvlink_rag.types import Document


@dataclass
class GenRequest:
    """One generation request.

    Attributes:
        make_engine: returns the engine to use (its adapter and link tokens, a per-request cache view);
            called in the scheduler's thread under the model lock (loading a LoRA adapter is allowed).
        docs: documents in prompt order (empty for a chat without documents, full mode included).
        text_ids: ``[tokens]`` ids after the documents: question with the assistant header, or a whole
            conversation (see :func:`kvlink_rag.text.conversation.conversation_ids`).
        mode: ``'linked'`` (cached documents, link tokens) or ``'full'`` (causal prefill of every token).
        k: link tokens per document (None: the engine's K; 0: none).
        params: sampling parameters (per request: temperature, top_p, seed, max_new_tokens).
        t0: ``time.perf_counter()`` the request's timings count from (seconds).
        adapter: the adapter's name as asked (requests running at once use at most ``max_adapters``
            distinct ones: loading another could unload one in use).
        keep_logits: keep every step's ``[vocab]`` float32 logits in the result (``kvlink-rag verify``).
        retention: fraction of each document's tokens kept (linked; :mod:`kvlink_rag.retention`).
        recompute_ratio: CacheBlend's fraction of document tokens recomputed (linked; 0 = none).
        explain: collect the attention the question and answer pay to each slot (linked; the result's
            ``attention``).
        cold: computed without the prefix tree, read or written (mode ``full``'s comparison).
        tenant: whose request it is (the API key's tenant): fair admission's unit (:mod:`kvlink_rag.runtime.fair_admission`).
    """

    make_engine: Callable[[], Engine]
    docs: list[Document]
    text_ids: list[int]
    params: SamplingParams
    mode: str = "linked"
    k: int | None = None
    t0: float = field(default_factory=time.perf_counter)
    keep_logits: bool = False
    adapter: str | None = None
    retention: float = 1.0
    recompute_ratio: float = 0.0
    explain: bool = False
    cold: bool = False
    tenant: str = "default"

    def shared_prefix_key(self) -> tuple | None:
        """What requests with the same documents, mode, K and adapter have in common (their prompts share
        the system prompt, documents and link tokens), or None without documents, when cold, or when the request keeps
        its document KV to itself (retention below 1, CacheBlend, explain: it reads no documents from the
        prefix tree, :class:`kvlink_rag.runtime.admit.Reuse`)."""
        from kvlink_rag.runtime.admit import Reuse

        if not self.docs or self.cold or (self.mode == "linked" and Reuse(self.retention, self.recompute_ratio, self.explain).own):
            return None
        return (self.mode, self.k, self.adapter, tuple((d.text, d.title) for d in self.docs))

    def estimated_new_tokens(self, link_k: int) -> int:
        """Tokens the prefill forward computes, before any prefix match (for length buckets)."""
        return len(self.text_ids) + (link_k * len(self.docs) if self.mode == "linked" else 0)


@dataclass
class GenResult:
    """A finished request.

    Attributes:
        token_ids: generated ids (stop token excluded).
        finish_reason: ``'stop'`` or ``'length'``.
        prompt_tokens: positions the prompt spans (its tokens; retention's dropped tokens count too).
        cached_tokens: prompt tokens not computed now: from the prefix tree or stored document caches.
        tree_tokens: prompt tokens found in the prefix tree.
        tree_docs: cache keys of documents whose KV came from the prefix tree.
        encoded_tokens: prompt tokens of documents encoded now; hit_sizes: cache key -> tokens of each document
            served from its stored cache.
        engine: the engine used (its cache view recorded per-document hits).
        logits: per generated token the ``[vocab]`` float32 logits it was sampled from (``keep_logits``).
        last_layer_kv: with ``keep_logits``, the prompt's last-layer ``(k, v)``, each ``[kv_heads,
            prompt_tokens, head_dim]`` in storage order (keys after RoPE).
        logprobs: with ``params.logprobs``: per generated token its
            :class:`~kvlink_rag.decoding.logprobs.TokenLogprob` (raw model log-softmax), else None.
        timings: seconds: ``queue_wait_s``, ``load_s`` (document caches), ``prefill_s``, ``ttft_s``,
            ``total_s`` (all from ``t0``).
        attention: with ``explain``, ``(AttentionMass, LinkedContext)`` (:meth:`RunningRequest.explained`).
    """

    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    tree_tokens: int
    tree_docs: set[str]
    engine: Engine | None
    timings: dict[str, float]
    logits: list | None = None
    last_layer_kv: tuple | None = None
    attention: tuple | None = None
    encoded_tokens: int = 0
    hit_sizes: dict[str, int] = field(default_factory=dict)
    logprobs: list | None = None

    @classmethod
    def of(cls, req: GenRequest, rr) -> GenResult:
        """The result of ``req`` from its finished :class:`~kvlink_rag.runtime.running.RunningRequest` ``rr``
        (``total_s`` measured now from ``req.t0``)."""
        timings = dict(rr.timings, total_s=time.perf_counter() - req.t0)
        return cls(list(rr.tokens), rr.finish_reason or "length", rr.context_tokens, rr.cached_tokens,
                   rr.tree_tokens, set(rr.tree_docs), rr.engine, timings, rr.logits, rr.last_layer_kv,
                   rr.explained(), encoded_tokens=rr.encoded_tokens, hit_sizes=dict(rr.hit_sizes),
                   logprobs=rr.logprobs)


class RequestHandle:
    """The answer of one request as it is generated: iterate for token ids, get the result at the end.

    Raises (while iterating): whatever failed the request in the scheduler (e.g. ContextTooLong).
    """

    def __init__(self, request: GenRequest):
        self.request = request
        self._events: queue.Queue = queue.Queue()
        self._cancelled = threading.Event()
        self.result: GenResult | None = None

    # -- scheduler side ----------------------------------------------------------------------------
    def put_token(self, token_id: int, logprob: TokenLogprob | None = None) -> None:
        """Hand over a sampled token (with its log-probability when the request asked for them)."""
        self._events.put(("token", token_id if logprob is None else (token_id, logprob)))

    def finish(self, result: GenResult) -> None:
        self._events.put(("done", result))

    def fail(self, error: BaseException) -> None:
        self._events.put(("error", error))

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    # -- front-end side ----------------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop generating (the slot is freed before the scheduler's next step); a reader waiting in
        :meth:`tokens` wakes up with :class:`~kvlink_rag.runtime.cancel.Cancelled`. Any thread may call it."""
        if not self._cancelled.is_set():
            self._cancelled.set()
            self._events.put(("cancelled", None))

    def tokens(self) -> Generator[int | tuple[int, TokenLogprob], None, GenResult]:
        """Token ids as sampled (``(id, TokenLogprob)`` pairs when the request asked for ``logprobs``);
        returns the :class:`GenResult`. Closing the generator cancels the request.

        Raises:
            Cancelled: :meth:`cancel` was called (the client went away).
        """
        try:
            while True:
                kind, value = self._events.get()
                if kind == "token":
                    yield value
                elif kind == "done":
                    self.result = value
                    return value
                elif kind == "cancelled":
                    raise Cancelled()
                else:
                    raise value
        finally:
            if self.result is None:
                self.cancel()

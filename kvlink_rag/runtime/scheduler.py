"""The batching scheduler: continuous batching of linked queries and chat turns over one model.

One thread owns the model's forwards. Each step (Orca's iteration-level scheduling, Yu et al., OSDI 2022; as in
vLLM, SGLang and nano-vllm) it admits waiting requests (their prefill: link tokens and question, or a chat turn's
new message), and runs one packed forward per adapter over every running request's new tokens: a decode token for
requests already generating, the prefill of those just admitted (:mod:`kvlink_rag.runtime.ragged`: no padding; each
request attends only to its own KV). Waiting requests (:mod:`kvlink_rag.runtime.waiting`) are grouped by prefill
length into short / medium / long buckets, so a step's prefills are of similar cost; the oldest request's bucket
goes first, and any request that waited longer than ``max_wait_s`` is admitted before the others (nothing starves).
Prompt prefixes already computed (system prompt, documents in the same order, earlier chat turns) come from the
:class:`~kvlink_rag.runtime.prefix_tree.PrefixTree`. A long prompt's chunk runs last in its step and yields between
its layers to new short requests and to the others' decode steps (:mod:`kvlink_rag.runtime.interjection`).

The model lock is taken per step, so other model work (embedded precompute, in chunks) runs between
steps rather than stalling every request for a whole document.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict

from .admission import AdmissionPolicy, BucketPolicy
from .block_pool import PoolExhausted, kv_pool
from .cancel import cancellable_engine
from ..model.loader import LoadedModel
from .interjection import LayerSlices
from .gen_request import GenRequest, GenResult, RequestHandle
from .limits import SchedulerLimits
from ..omp_pool import release_thread_pool
from .step_budget import allot, is_long, key_weight
from .waiting import Waiting, WaitingQueue

log = logging.getLogger(__name__)

class Scheduler:
    """Runs submitted :class:`GenRequest` s in continuous batches on one background thread.

    Args:
        lm: the loaded model (all engines of the requests share it).
        tree: the prefix tree (sharing off: a tree with a zero byte budget).
        model_lock: taken for each step (shared with other model users).
        limits: see :class:`SchedulerLimits`.
        observe: ``observe(rows, waits)`` after each step (metrics: requests run, queue waits in s of those admitted).
        policy: the admission order (:mod:`kvlink_rag.runtime.admission`; default the S/M/L buckets).
    """

    def __init__(self, lm, tree, model_lock, limits: SchedulerLimits | None = None, observe=None,
                 policy: AdmissionPolicy | None = None):
        self.lm, self.tree, self.model_lock, self.observe = lm, tree, model_lock, observe
        if isinstance(lm, LoadedModel):  # a full pool asks the tree to evict its LRU leaves first
            kv_pool(lm).add_reclaimer(tree.shrink)
        self.limits = limits or SchedulerLimits()
        self.key_weight = key_weight(lm) if isinstance(lm, LoadedModel) else 0.0  # chunk cost of attention
        self.policy = policy or BucketPolicy()
        self.waiting = WaitingQueue(self.limits, self.policy)  # the admission choice of each step
        self.running: list[tuple[RequestHandle, object]] = []
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="kvlink-scheduler", daemon=True)
        self.slices = LayerSlices()  # the long prompt's forward in flight that yields between its layers
        self.steps = 0  # the thread starts with the first request: workers and CLI commands never need it
        release_thread_pool()  # the model's forwards run on the scheduler's thread: this one (that loaded it) stops

    # -- front-end side ---------------------------------------------------------------------------
    def submit(self, request: GenRequest, link_k: int = 0) -> RequestHandle:
        """Queue ``request``; returns its handle at once.

        Raises:
            QueueFull: ``max_waiting`` requests are already waiting.
        """
        handle = RequestHandle(request)
        tokens = request.estimated_new_tokens(link_k)
        release_thread_pool()  # whatever this thread computed for the request, the scheduler's team runs it
        with self._cond:
            self.waiting.add(handle, tokens)
            if not self._thread.is_alive() and not self._stop:
                self._thread.start()
            self._cond.notify()
        return handle

    def busy(self) -> bool:
        """Whether requests are running or waiting (other model work should wait for a quiet moment)."""
        return bool(self.running or self.waiting)

    def stats(self) -> dict:
        """``{running, waiting, queued_prefill_tokens, steps, tree: PrefixTree.stats(), running_own_bytes,
        kv_pool: BlockPool.stats()}`` (bytes; queued_prefill_tokens: prompt tokens of the waiting requests)."""
        with self._cond:
            own = sum(rr.seq.own_bytes for _, rr in self.running if rr.seq is not None)
            pool = kv_pool(self.lm).stats() if isinstance(self.lm, LoadedModel) else {}
            return {"running": len(self.running), "waiting": len(self.waiting), "steps": self.steps, "kv_pool": pool,
                    "queued_prefill_tokens": self.waiting.queued_tokens(), "tree": self.tree.stats(),
                    "running_own_bytes": own}

    def close(self) -> None:
        """Stop the thread after the current step; waiting and running requests fail."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    # -- the loop ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._stop and not self.waiting and not self.running:
                    release_thread_pool()  # idle: other threads' model work (precompute) runs at full speed
                while not self._stop and not self.waiting and not self.running:
                    if isinstance(self.lm, LoadedModel):
                        kv_pool(self.lm).trim()  # arenas empty since the last burst go back after their idle_s
                    self._cond.wait(timeout=1.0)
                if self._stop:
                    break
                chosen = self.waiting.choose(self.running)
            try:
                self._step(chosen)
            except Exception:  # noqa: BLE001 - the loop must survive; the step failed its own requests
                log.exception("scheduler step failed")
        self._fail_all(RuntimeError("the scheduler stopped"))

    def _step(self, chosen: list[Waiting]) -> None:
        with self.model_lock:
            admitted, waits = self._admit(chosen)
            self._drop_cancelled()
            rows = self._run(self.running, preemptible=True)
            self._drop_cancelled()  # cancelled during this step: KV freed now, not after the next admission
            self.steps += 1
        if self.observe is not None:
            self.observe(rows, waits)

    def _admit(self, chosen: list[Waiting]) -> tuple[list[tuple[RequestHandle, object]], list[float]]:
        """Admit ``chosen`` (prefix-tree match, stored documents into blocks, prefill inputs) into :attr:`running`;
        returns the admitted ``(handle, request)`` pairs and their queue waits (seconds)."""
        from kvlink_rag.runtime.admit import Reuse, admit

        admitted, waits = [], []
        for w in chosen:
            req = w.handle.request
            waited = time.perf_counter() - w.since
            if w.handle.cancelled:  # its client left while an earlier request of this step was admitted
                continue
            try:
                eng = cancellable_engine(req.make_engine(), lambda h=w.handle: h.cancelled)  # this one's handle
                rr = admit(eng, self.tree, req.docs, req.text_ids, req.params, req.mode, req.k,
                           Reuse(req.retention, req.recompute_ratio, req.explain), req.cold)
                rr.logits = [] if req.keep_logits else None
            except PoolExhausted as e:  # waits for running requests' blocks; alone it can never fit
                if not self.running:
                    w.handle.fail(e)
                    continue
                with self._cond:
                    self.waiting.put_back(chosen[chosen.index(w):])
                break
            except Exception as e:  # noqa: BLE001 - the request fails, the others go on
                w.handle.fail(e)
                continue
            rr.timings["queue_wait_s"] = waited
            waits.append(waited)
            self._charge(req, w.tokens, 0)
            admitted.append((w.handle, rr))
            with self._cond:
                self.running.append((w.handle, rr))
        return admitted, waits

    def _run(self, running: list[tuple[RequestHandle, object]], preemptible: bool) -> int:
        """One forward per adapter over ``running``'s tokens of this step (:func:`allot`); returns the rows run.
        ``preemptible``: long prompts' chunks run last, in forwards that yield between their layers
        (:mod:`.interjection`)."""
        groups: dict = defaultdict(list)
        yielding: dict = defaultdict(list)
        cap = self.limits.long_prefill_budget or None
        for h, rr, n in allot(running, self.limits.max_step_tokens, cap, self.key_weight):
            long = preemptible and rr.pending_left > 1 and is_long(rr, self.limits.max_step_tokens)
            (yielding if long else groups)[rr.adapter].append((h, rr, rr.next_chunk(n)))
        t0 = time.perf_counter()
        for adapter, members in groups.items():
            self._forward(adapter, members)
        others_s = time.perf_counter() - t0
        for adapter, members in yielding.items():
            self.slices.pause([rr for _, rr, _ in members], others_s)
            try:
                self._forward(adapter, members, preemptible=True)
            finally:
                self.slices.clear()
        return sum(len(m) for m in groups.values()) + sum(len(m) for m in yielding.values())

    def _interject(self) -> None:
        """Between two layers of a long prompt's forward: new short requests' prefill, due decode steps."""
        sl = self.slices
        if sl.active:
            return
        chosen = []
        if self.waiting.items:  # the common case reads a list's length, no lock
            with self._cond:
                chosen = self.waiting.choose(self.running, max_tokens=self.limits.max_step_tokens)
        due = sl.decode_due(self.running)
        if not chosen and not due:
            return
        sl.active, t0, rows, waits = True, time.perf_counter(), 0, []
        try:
            admitted, waits = self._admit(chosen)
            rows, self.steps = self._run(due + admitted, preemptible=False), self.steps + 1
        except Exception:  # noqa: BLE001 - never fail the paused forward's requests for another's step
            log.exception("an interjected step failed")
        finally:
            sl.active = False
            sl.ran(time.perf_counter() - t0)
        if self.observe is not None:
            self.observe(rows, waits)

    def _forward(self, adapter, members, preemptible: bool = False) -> None:
        """One packed forward for ``members`` (same adapter): ``(handle, request, chunk)``; requests whose
        prefill this chunk completes (and decoding ones) sample, emit and maybe finish. ``preemptible``: other
        requests are served between its layers (:meth:`_interject`)."""
        import torch

        from kvlink_rag.model.lora import runner_adapter
        from kvlink_rag.runtime.model_runner import forward_ragged
        from kvlink_rag.runtime.ragged import RaggedBatch

        batch = RaggedBatch()
        for _, rr, chunk in members:
            batch.add(rr.seq, chunk.num_tokens, chunk.mask, rr.attention)  # attention: explain's rows
        embeds = torch.cat([chunk.embeds for _, _, chunk in members])
        positions = torch.cat([chunk.positions for _, _, chunk in members])
        t0 = time.perf_counter()
        try:
            with runner_adapter(self.lm, adapter):  # the runner reads the adapter itself
                hook = self._interject if preemptible else None
                logits = forward_ragged(self.lm, batch, embeds, positions, hook)  # [rows, vocab]
        except Exception as e:  # noqa: BLE001 - fail this group's requests, keep serving others
            for h, rr, _ in members:
                self._end(h, rr, error=e)
            return
        dt = time.perf_counter() - t0
        for (h, rr, _), lg in zip(members, logits):
            if h.cancelled:  # its client left during the forward: nothing more is emitted
                continue
            first = not rr.shared
            if first:
                rr.timings["prefill_s"] += dt  # every chunk of its prefill
            if rr.pending_left > 0:
                continue  # more chunks of its prefill to come
            try:
                tok = rr.step(lg)
            except Exception as e:  # noqa: BLE001 - e.g. sampling failed: this request ends, the batch goes on
                self._end(h, rr, error=e)
                continue
            self._charge(h.request, 0, 1)
            if first:
                rr.timings["ttft_s"] = time.perf_counter() - h.request.t0
            if tok is not None:
                h.put_token(tok, rr.logprobs[-1] if rr.logprobs else None)
            if rr.done:
                self._end(h, rr)

    def _charge(self, request: GenRequest, prompt_tokens: int, output_tokens: int) -> None:
        """Tell a policy that counts served tokens (:class:`~kvlink_rag.runtime.admission.ServedTokens`) what it served."""
        served = getattr(self.policy, "served", None)
        if served is not None:
            served(request, prompt_tokens, output_tokens)

    def _drop_cancelled(self) -> None:
        for h, rr in list(self.running):
            if h.cancelled:
                self._end(h, rr, error=None, cancelled=True)

    def _end(self, h: RequestHandle, rr, error: BaseException | None = None, cancelled: bool = False) -> None:
        """Finish a running request: tree insert and unpin, free its slot, report."""
        try:
            if error is None and not cancelled:
                rr.finish()
            else:
                rr.finish_reason = rr.finish_reason or "cancelled"
                if rr.match is not None:
                    self.tree.release(rr.match)
                    rr.match = None
        finally:
            if error is not None or cancelled:
                if rr.seq is not None:
                    rr.seq.release()  # its own blocks go back to the pool now
                rr.seq = rr.pending = None
            with self._cond:
                self.running = [(x, r) for x, r in self.running if x is not h]
        if error is not None:
            h.fail(error)
        elif not cancelled:
            h.finish(GenResult.of(h.request, rr))

    def _fail_all(self, error: BaseException) -> None:
        with self._cond:
            waiting, running = self.waiting.drain(), list(self.running)
        for w in waiting:
            w.handle.fail(error)
        for h, rr in running:
            self._end(h, rr, error=error)

"""Equivalence built in: batched and prefix-shared serving against one request at a time, unshared.

For each sample request the scheduler's output (submitted together with the others, after a first pass
that filled the prefix tree) is compared with the engine's one-request path (:meth:`Engine.link_context`
and a teacher-forced decode over the same tokens): the max |logit difference| over every generated
step, the cosine of the prompt's last-layer keys and values, and whether greedy decoding agrees token for
token (:meth:`Engine.answer`).
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass

import torch

from kvlink_rag.decoding.answer import run_to_end
from kvlink_rag.engine import Engine
from kvlink_rag.linking.kvcache import cache_tensors
from kvlink_rag.model.lora import adapter_scope
from kvlink_rag.runtime.gen_request import GenRequest, GenResult
from kvlink_rag.runtime.prefix_tree import PrefixTree
from kvlink_rag.runtime.limits import SchedulerLimits
from kvlink_rag.runtime.scheduler import Scheduler
from kvlink_rag.types import Document
from service.model_lock import FairLock


@dataclass
class Agreement:
    """One request's comparison.

    Attributes:
        max_abs_logit_diff: max over steps and vocabulary of |batched - single| (float32 logits).
        key_cosine, value_cosine: cosine of the prompt's last-layer keys / values, flattened.
        greedy_agree: the batched tokens equal the single path's greedy tokens.
        tokens: generated tokens compared; tree_tokens: prompt tokens the batched run took from the tree.
    """

    max_abs_logit_diff: float
    key_cosine: float
    value_cosine: float
    greedy_agree: bool
    tokens: int
    tree_tokens: int


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0))


@torch.inference_mode()
def single_reference(engine: Engine, question: str, docs: list[Document], tokens: list[int]
                     ) -> tuple[list[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Logits ``[vocab]`` before each of ``tokens`` on the one-request path (teacher forced), and the
    prompt's last-layer ``(k, v)`` ``[kv_heads, prompt_tokens, head_dim]``."""
    ctx, _ = engine.link_context(question, docs)
    keys, values = cache_tensors(ctx.cache)
    kv = (keys[-1].clone(), values[-1].clone())
    logits, pos = [ctx.last_logits], ctx.next_position
    with adapter_scope(engine.lm, engine.adapter):
        for tok in tokens[:-1]:
            out = engine.lm.model(input_ids=torch.tensor([[tok]], device=engine.lm.device),
                                  position_ids=torch.tensor([[pos]], device=engine.lm.device),
                                  cache=ctx.cache, use_cache=True, logits_to_keep=1)
            logits.append(out.logits[0, -1].float())
            pos += 1
    return logits, kv


def _batched(engine: Engine, cases: list[tuple[str, list[Document]]], max_new_tokens: int) -> list[GenResult]:
    """Every case through one scheduler, twice (the second pass shares the first's prefixes)."""
    sched = Scheduler(engine.lm, PrefixTree(1 << 34), FairLock(), SchedulerLimits(max_running=len(cases)))
    try:
        for _ in range(2):
            handles = [sched.submit(GenRequest(lambda: engine, docs, engine.template.question_ids(
                engine.lm.tokenizer, q).tolist(), engine.sampling(max_new_tokens=max_new_tokens, temperature=0.0),
                keep_logits=True), engine.link_k) for q, docs in cases]
            results = [run_to_end(h.tokens()) for h in handles]
        return results
    finally:
        sched.close()


def verify(engine: Engine, cases: list[tuple[str, list[Document]]], max_new_tokens: int = 16,
           lock: threading.Lock | None = None) -> list[Agreement]:
    """Compare batched, prefix-shared serving with the one-request path for each ``(question, docs)``.

    Raises:
        ValueError, ContextTooLong: a case cannot be linked.
    """
    results = _batched(engine, cases, max_new_tokens)
    out = []
    for (q, docs), res in zip(cases, results):
        logits, (k, v) = single_reference(engine, q, docs, res.token_ids)
        n = min(len(logits), len(res.logits))
        diff = max(float((a - b).abs().max()) for a, b in zip(logits[:n], res.logits[:n]))
        bk, bv = res.last_layer_kv
        greedy = engine.answer(q, docs, max_new_tokens=max_new_tokens, temperature=0.0).token_ids
        out.append(Agreement(diff, _cos(bk, k), _cos(bv, v), greedy == res.token_ids, len(res.token_ids),
                             res.tree_tokens))
    return out


def as_rows(agreements: list[Agreement]) -> list[dict]:
    """Plain dicts (JSON)."""
    return [asdict(a) for a in agreements]

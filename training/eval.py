"""Answer-quality evaluation: full prefill vs reused caches (naive, linked) on multi-document NQ.

Metric: best_subspan_em (Liu et al., 2023; KVLink, arXiv 2502.16002, section 4) with a 95% bootstrap
interval, plus the mean negative log-likelihood (nats/token) of the first gold answer given the context.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kvlink_rag.engine import Document, Engine
from kvlink_rag.generate import full_prefill
from kvlink_rag.nq import NQExample, best_subspan_em, build_documents

MODES = ("full", "naive", "linked", "linked-untrained")


@dataclass
class ModeResult:
    """Per-question scores of one mode."""

    em: list[float] = field(default_factory=list)
    nll: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)

    def summary(self, seed: int = 0) -> dict:
        """``{"accuracy", "ci95", "answer_nll", "ttft_s", "n"}`` (means; ttft median)."""
        n = len(self.em)
        lo, hi = bootstrap_ci(self.em, seed=seed)
        return {"accuracy": sum(self.em) / n if n else 0.0, "ci95": [lo, hi],
                "answer_nll": sum(self.nll) / n if n else 0.0,
                "ttft_s": sorted(self.ttft)[n // 2] if n else 0.0, "n": n}


def bootstrap_ci(values: list[float], reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of the mean of ``values``."""
    if not values:
        return 0.0, 0.0
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(reps))
    return means[int(0.025 * reps)], means[int(0.975 * reps) - 1]


@torch.inference_mode()
def answer_nll(engine: Engine, question: str, docs: list[Document], answer: str, mode: str) -> float:
    """Mean NLL in nats per token of ``answer`` after the prompt, under ``mode`` ('full' or a reuse mode)."""
    lm = engine.lm
    ans = torch.tensor(lm.tokenizer(answer, add_special_tokens=False)["input_ids"], dtype=torch.long)
    if mode == "full":
        ctx = full_prefill(lm, engine.prompt_ids(question, docs))
    else:
        ctx, _ = engine.link_context(question, docs, k=0 if mode == "naive" else None)
    pos = torch.arange(ctx.next_position, ctx.next_position + len(ans))
    out = lm.model(input_ids=ans[None].to(lm.device), position_ids=pos[None].to(lm.device), cache=ctx.cache,
                   use_cache=True)
    logits = torch.cat([ctx.last_logits[None], out.logits[0, :-1].float()])
    return float(F.cross_entropy(logits.cpu(), ans))


def evaluate(engines: dict[str, Engine], examples: list[NQExample], n: int, n_docs: int, gold_position: str,
             seed: int = 0, max_new_tokens: int = 32, progress=None) -> dict[str, ModeResult]:
    """Run every mode in ``engines`` (mode name -> engine) over the first ``n`` questions.

    Documents are precomputed before timing (as at ingest), so TTFT measures reuse.
    """
    results = {m: ModeResult() for m in engines}
    for i in range(n):
        ex = examples[i]
        docs, _ = build_documents(examples, i, n_docs, gold_position, seed)
        for mode, eng in engines.items():
            if mode != "full":
                for d in docs:
                    eng.get_or_encode(d)
            if mode == "full":
                a = eng.answer_full(ex.question, docs, max_new_tokens=max_new_tokens, temperature=0.0)
            else:
                a = eng.answer(ex.question, docs, k=0 if mode == "naive" else None,
                               max_new_tokens=max_new_tokens, temperature=0.0)
            r = results[mode]
            r.em.append(best_subspan_em(a.text, ex.answers))
            r.ttft.append(a.ttft_s)
            r.answers.append(a.text)
            r.nll.append(answer_nll(eng, ex.question, docs, ex.answers[0], mode))
        if progress is not None:
            progress()
    return results

"""Attribution methods against the gold passage on NQ-open: does the document ranked first hold the gold
passage? Attention share (:mod:`kvlink_rag.explain.attribution`) and leave-one-document-out
(:mod:`kvlink_rag.explain.leave_one_out`) on the same linked answer, with each method's cost, in one run.

Per question (gold position rotated first/middle/last as ``kvlink-rag eval --gold-position rotate``):
documents precomputed (as at ingest), then on every :data:`PLAIN_EVERY`-th question a plain linked answer
(timed), the answer under attention capture (timed: its extra time over the plain answer is the attention
method's cost), then leave-one-out over that answer's tokens (timed: all of it is that method's cost).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from evaluation.nq import NQExample, best_subspan_em, build_documents
from kvlink_rag.cache import MemoryCache
from kvlink_rag.engine import Engine
from kvlink_rag.explain.answers import explain_answer
from kvlink_rag.explain.leave_one_out import leave_one_out

from .eval import position_for


PLAIN_EVERY = 4  # the plain (uncaptured) answer, the attention cost's baseline, on every 4th question only


def attribution_row(engine: Engine, examples: list[NQExample], i: int, n_docs: int, seed: int,
                    max_new_tokens: int) -> dict:
    """One question's row: gold slot, EM, both methods' per-document scores and seconds (``plain_s`` only on
    every :data:`PLAIN_EVERY`-th question, else None)."""
    ex = examples[i]
    pos = position_for("rotate", i)
    docs, slot = build_documents(examples, i, n_docs, pos, seed)
    for d in docs:
        engine.get_or_encode(d)
    t0 = time.perf_counter()
    if i % PLAIN_EVERY == 0:
        engine.answer(ex.question, docs, max_new_tokens=max_new_tokens)
    t1 = time.perf_counter()
    ans, att = explain_answer(engine, ex.question, docs, max_new_tokens=max_new_tokens)
    t2 = time.perf_counter()
    loo = leave_one_out(engine, ex.question, docs, ans.token_ids)
    t3 = time.perf_counter()
    return {"index": i, "gold_position": pos, "gold_slot": slot, "answer": ans.text,
            "em": best_subspan_em(ans.text, ex.answers), "answer_tokens": loo.answer_tokens,
            "attention": [d.share for d in att.documents], "loo": loo.drops,
            "plain_s": t1 - t0 if i % PLAIN_EVERY == 0 else None, "explain_s": t2 - t1, "loo_s": t3 - t2}


def run_attribution_eval(engine: Engine, examples: list[NQExample], n: int, n_docs: int, rows_path: Path,
                         seed: int = 0, max_new_tokens: int = 24, progress: Callable[[dict], None] | None = None,
                         start: int = 0) -> list[dict]:
    """Rows of questions ``start..n-1`` appended to ``rows_path`` (JSONL; questions already there are skipped,
    so a stopped run resumes; shards of one run write files of their own). Returns all rows."""
    rows = [json.loads(x) for x in rows_path.read_text().splitlines() if x.strip()] if rows_path.exists() else []
    done = {r["index"] for r in rows}
    with open(rows_path, "a") as sink:
        for i in range(start, n):
            if i in done:
                continue
            engine.cache = MemoryCache()  # this question's documents only (an eval holds no others)
            row = attribution_row(engine, examples, i, n_docs, seed, max_new_tokens)
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            rows.append(row)
            if progress is not None:
                progress(row)
    return rows

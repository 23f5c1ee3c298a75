"""A cached query's TTFT while a long full-prefill request runs through the scheduler, against its idle TTFT,
with chunked prefill (the settings' step budget) and without (one step takes the whole prefill). The prefix
tree is off, so every full request computes its whole prompt (with it, repeats would be served from it).

Sample ``i`` sends the query :data:`FIRST_ARRIVAL_S` + ``i`` x :data:`ARRIVAL_STEP_S` seconds after the long
request, wrapped into the first 80% of the previous long request's duration, so the samples land at different
phases of its steps and always while it runs: with one fixed delay every sample arrived at the same point of the
same step, and the median was that step's remaining time (one run 1.8x idle, the next 5.1x, on the same code)."""

from __future__ import annotations

import statistics
import threading
import time

from evaluation.nq import NQExample
from kvlink_rag.engine import Engine

from .interference import _long_text
from .serving_common import TENANT, ingest, runtime

UNCHUNKED = 1 << 20  # a step budget no prefill reaches: the scheduler as it was before chunked prefill
FIRST_ARRIVAL_S, ARRIVAL_STEP_S = 0.3, 0.37  # sample i's query arrives 0.3 + 0.37 i s into the long prefill


def _ttft(queries, question: str, doc_ids: list[str], mode: str = "linked", new: int = 8) -> tuple[float, float]:
    """TTFT and the whole answer's seconds (``new`` tokens, all of them: the decode steps the long prompt's steps
    delay count too)."""
    r = queries.answer(queries.plan(TENANT, question, doc_ids, mode=mode, max_new_tokens=new, temperature=0.0,
                                    ignore_eos=True))
    return float(r.timings["ttft_s"]), float(r.timings["total_s"])


def _one_budget(engine: Engine, examples: list[NQExample], long_text: str, step_tokens: int, cap: int,
                samples: int, log) -> dict:
    rt = runtime(engine, max_step_tokens=step_tokens, long_prefill_budget=cap,
                 prefix_cache_bytes=0)  # no tree: every full request prefills
    try:
        ingest(rt, {"short": examples[0]})
        rt.documents.ingest(TENANT, "long", long_text)
        while rt.queue.depth():
            time.sleep(0.05)
        q = rt.queries
        _ttft(q, examples[0].question, ["short"])  # warm: the short document is cached, the prefix tree warm
        idle = [_ttft(q, examples[0].question, ["short"]) for _ in range(samples)]  # (ttft, total) each
        busy, full_s = [], []
        for i in range(samples):
            t0 = time.perf_counter()
            worker = threading.Thread(target=lambda: _ttft(q, f"{examples[1].question} ({i})", ["long"], "full", 1))
            worker.start()
            span = 0.8 * full_s[-1] - FIRST_ARRIVAL_S if full_s else 0.0
            offset = ARRIVAL_STEP_S * i
            time.sleep(FIRST_ARRIVAL_S + (offset % span if span > 0 else offset))  # under way, at another phase
            busy.append(_ttft(q, examples[0].question, ["short"]))
            worker.join()
            full_s.append(time.perf_counter() - t0)
    finally:
        rt.close()
    p50 = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731 - 0: TTFT, 1: whole answer
    log(f"step budget {step_tokens}, long-prefill cap {cap}: idle {p50(idle, 0):.2f} s, busy {p50(busy, 0):.2f} s "
        f"(max {max(b[0] for b in busy):.2f}); whole answer idle {p50(idle, 1):.2f} s, busy {p50(busy, 1):.2f} s")
    return {"step_tokens": step_tokens, "long_prefill_budget": cap, "idle_ttft_p50_s": p50(idle, 0),
            "busy_ttft_p50_s": p50(busy, 0), "busy_ttft_max_s": max(b[0] for b in busy),
            "busy_ttft_s": [b[0] for b in busy], "ratio": p50(busy, 0) / p50(idle, 0),
            "idle_answer_p50_s": p50(idle, 1), "busy_answer_p50_s": p50(busy, 1),
            "answer_ratio": p50(busy, 1) / p50(idle, 1), "full_request_s": statistics.median(full_s)}


def prefill_interference(engine: Engine, examples: list[NQExample], long_tokens: int = 3300, samples: int = 3,
                         step_tokens: int = 256, long_prefill_budget: int = 0, log=print) -> dict:
    """Rows for the settings' chunked budget (with its long-prefill cap, then without it when one is set) and for
    an unchunked scheduler, side by side in one run."""
    text = _long_text(examples, engine, long_tokens, 100)
    n = int(engine.document_ids(type(examples[0].gold)(text)).numel())
    budgets = [(step_tokens, long_prefill_budget)] + ([(step_tokens, 0)] if long_prefill_budget else [])
    rows = [_one_budget(engine, examples, text, b, cap, samples, log) for b, cap in budgets + [(UNCHUNKED, 0)]]
    return {"full_prompt_document_tokens": n, "rows": rows}


def markdown(result: dict) -> str:
    lines = [f"## A cached query while a {result['full_prompt_document_tokens']}-token full prefill runs (scheduler)", "",
             "| step budget (tokens) | long-prefill cap | idle TTFT p50 s | TTFT while the full prefill runs, p50 s | "
             "ratio | whole answer (8 tokens) idle / busy, p50 s | full request s |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        budget = "unchunked" if r["step_tokens"] == UNCHUNKED else str(r["step_tokens"])
        cap = r.get("long_prefill_budget") or "none"
        lines.append(f"| {budget} | {cap} | {r['idle_ttft_p50_s']:.2f} | {r['busy_ttft_p50_s']:.2f} | "
                     f"{r['ratio']:.1f}x | {r['idle_answer_p50_s']:.2f} / {r['busy_answer_p50_s']:.2f} | "
                     f"{r['full_request_s']:.1f} |")
    return "\n".join(lines) + "\n"

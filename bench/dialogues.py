"""16 concurrent 5-turn dialogues over one document set and system prompt, prefix sharing on vs off."""

from __future__ import annotations

import statistics
import threading
import time

from evaluation.nq import NQExample
from kvlink_rag.engine import Engine
from kvlink_rag.text.conversation import Turn

from .serving_common import TENANT, ingest, runtime
from .timing import run_clients


def dialogues(engine: Engine, examples: list[NQExample], n_dialogues: int = 16, turns: int = 5, docs: int = 5,
              new_tokens: int = 16, log=print) -> dict:
    """Each dialogue asks ``turns`` NQ questions in turn (the assistant's answers kept in the history) over
    the same ``docs`` documents; ``{"shared": row, "unshared": row, ...ratios}``.

    Each variant's runtime first answers one two-turn warm-up dialogue over ``docs`` other documents, untimed, so
    that neither variant pays the process's one-time costs (oneDNN's kernels generated, thread pools started, and
    until 4f6abd2 the adapter merged into the prefill weights: the first variant's warm-up took 0.48 s and 83k
    page faults, the second's 0.23 s and 12k on the AMX Xeon of session 2026-12-08,
    ``docs/bench/dialogues-warmup-2026-12-08/``),
    which fell on whichever variant ran first (sharing). The warm-up's KV is then evicted from the prefix tree, so
    the timed dialogues start from an empty tree as before and their peak KV counts only their own.

    Raises:
        ValueError: fewer than ``2 * docs + n_dialogues * turns + 2`` examples.
    """
    need = 2 * docs + n_dialogues * turns + 2
    if len(examples) < need:
        raise ValueError(f"{n_dialogues} dialogues of {turns} turns over {docs} documents need {need} examples "
                         f"(the warm-up's included), not {len(examples)}")
    pool = {f"d{i}": ex for i, ex in enumerate(examples[:docs])}
    questions = [ex.question for ex in examples[docs: docs + n_dialogues * turns]]
    rest = examples[docs + n_dialogues * turns:]
    warm = {f"w{i}": ex for i, ex in enumerate(rest[:docs])}
    warm_questions = [ex.question for ex in rest[docs: docs + 2]]
    out = {}
    for shared in (True, False):
        log(f"dialogues: {n_dialogues} x {turns} turns, prefix sharing {'on' if shared else 'off'}")
        rt = runtime(engine, **({} if shared else {"prefix_cache_bytes": 0}))
        try:
            ingest(rt, {**pool, **warm})
            _run(rt, list(warm), warm_questions, 1, 2, new_tokens)  # the warm-up: untimed
            rt.scheduler.tree.shrink(rt.scheduler.tree.nbytes)  # and its KV out of the tree: peak KV as before
            out["shared" if shared else "unshared"] = _run(rt, list(pool), questions, n_dialogues, turns, new_tokens)
        finally:
            rt.close()
    s, u = out["shared"], out["unshared"]
    out["throughput_ratio"] = s["turns_per_s"] / u["turns_per_s"]
    out["peak_kv_saving"] = 1 - s["peak_kv_bytes"] / u["peak_kv_bytes"] if u["peak_kv_bytes"] else None  # none sampled
    return out


def _run(rt, doc_ids: list[str], questions: list[str], n_dialogues: int, turns: int, new_tokens: int) -> dict:
    queries, sched = rt.queries, rt.scheduler
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            s = sched.stats()
            peak[0] = max(peak[0], s["tree"]["bytes"] + s["running_own_bytes"])
            time.sleep(0.001)  # 10 ms missed every running request of a short run on a fast CPU

    def dialogue(d: int) -> list[tuple[int, float]]:
        history, ttfts = [], []
        for t in range(turns):
            history.append(Turn("user", questions[d * turns + t]))
            r = queries.answer(queries.plan_chat(TENANT, history, doc_ids, max_new_tokens=new_tokens, temperature=0.0))
            history.append(Turn("assistant", r.answer or "-"))
            ttfts.append((t, r.timings["ttft_s"], r.context_tokens, r.cached_tokens))
        return ttfts

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        results, wall = run_clients(n_dialogues, list(range(n_dialogues)), dialogue)
    finally:
        stop.set()
        sampler.join()
    by_turn = {t: statistics.median(x[1] for r in results for x in r if x[0] == t) for t in range(turns)}
    cached = sum(x[3] for r in results for x in r) / max(1, sum(x[2] for r in results for x in r))
    return {"turns": n_dialogues * turns, "wall_s": wall, "turns_per_s": n_dialogues * turns / wall,
            "peak_kv_bytes": peak[0], "ttft_p50_by_turn_s": by_turn,
            "last_over_first_ttft": by_turn[turns - 1] / by_turn[0], "cached_token_share": cached}

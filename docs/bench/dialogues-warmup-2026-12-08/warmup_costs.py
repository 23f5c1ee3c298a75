"""What the dialogue bench's warm-up pays: for each call of bench.dialogues._run (per variant the untimed warm-up,
then the timed dialogues) its wall seconds, the process's minor page faults and how many adapter merges
(kvlink_rag.runtime.merged_lora.merged_linear) ran in it, with their seconds; a JSON line each.
Usage (repository root): .venv/bin/python docs/bench/dialogues-warmup-2026-12-08/warmup_costs.py > OUT.jsonl"""
import json, os, resource, sys, time

import bench.dialogues as bd
import kvlink_rag.runtime.merged_lora as ml
from cli.common import make_engine, make_settings
from evaluation.nq import load_nq

MERGES = {"n": 0, "s": 0.0}
merged_linear = ml.merged_linear


def counted(*a, **k):
    t0 = time.perf_counter()
    try:
        return merged_linear(*a, **k)
    finally:
        MERGES["n"] += 1
        MERGES["s"] += time.perf_counter() - t0


ml.merged_linear = counted
run = bd._run


def timed(rt, doc_ids, questions, n_dialogues, turns, new_tokens):
    MERGES.update(n=0, s=0.0)
    f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    r = run(rt, doc_ids, questions, n_dialogues, turns, new_tokens)
    print(json.dumps({"dialogues": n_dialogues, "turns": turns, "wall_s": round(time.perf_counter() - t0, 3),
                      "minflt": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0, "merges": MERGES["n"],
                      "merge_s": round(MERGES["s"], 3), "turns_per_s": round(r["turns_per_s"], 2)}), flush=True)
    return r


bd._run = timed
res = bd.dialogues(make_engine(make_settings()), load_nq(os.environ["KVLINK_RAG_NQ_PATH"]), log=lambda m: print(m, file=sys.stderr))
print(json.dumps({"ratio": round(res["throughput_ratio"], 3)}))

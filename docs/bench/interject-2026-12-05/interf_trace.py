"""Trace the scheduler's forwards during bench-interference (cap row only): per step, groups, rows, tokens, ms."""
import json, os, sys, time, threading
from kvlink_rag.runtime import scheduler as S
from kvlink_rag.runtime import model_runner as MR
trace = []
orig_step, orig_fwd, orig_rfwd = S.Scheduler._step, S.Scheduler._forward, MR.ModelRunner.forward
cur = {}
def step(self, chosen):
    t0 = time.perf_counter(); cur.clear(); cur["fwd"] = []
    orig_step(self, chosen)
    trace.append({"t": t0, "ms": (time.perf_counter() - t0) * 1e3, "admitted": len(chosen), "fwd": cur["fwd"]})
def fwd(self, adapter, members, preemptible=False):
    t0 = time.perf_counter()
    orig_fwd(self, adapter, members, preemptible)
    cur["fwd"].append({"adapter": adapter, "rows": len(members), "tokens": [c.num_tokens for _, _, c in members],
                       "ms": (time.perf_counter() - t0) * 1e3})
S.Scheduler._step, S.Scheduler._forward = step, fwd
from bench import prefill_interference as P
from cli.common import make_engine, make_settings
from evaluation.nq import load_nq
ex = load_nq(os.environ["KVLINK_RAG_NQ_PATH"])
settings = make_settings(max_document_tokens=3500)
eng = make_engine(settings)
text = P._long_text(ex, eng, 3300, 100)
row = P._one_budget(eng, ex, text, settings.max_step_tokens, settings.long_prefill_budget, int(sys.argv[2]), print)
json.dump({"row": row, "trace": trace}, open(sys.argv[1], "w"))

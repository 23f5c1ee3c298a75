import sys, time, os
import torch
MAIN1 = os.environ.get("MAIN1") == "1"
if MAIN1:
    torch.set_num_threads(1)
from cli.common import make_settings, make_engine
from evaluation.nq import load_nq
from bench.interference import _long_text
from bench.serving_common import TENANT, runtime
cap = int(sys.argv[1])
from kvlink_rag.runtime import scheduler as S
LOG = []
orig = S.Scheduler._forward
def fw(self, adapter, members):
    t0 = time.perf_counter(); orig(self, adapter, members)
    LOG.append((sum(c.num_tokens for _, _, c in members), max(rr.context_keys for _, rr, _ in members), time.perf_counter() - t0))
S.Scheduler._forward = fw
orig_step = S.Scheduler._step
STEPS = []
def st(self, chosen):
    t0 = time.perf_counter(); orig_step(self, chosen); STEPS.append(time.perf_counter() - t0)
S.Scheduler._step = st
orig_loop = S.Scheduler._loop
def lp(self):
    if MAIN1: torch.set_num_threads(2)
    orig_loop(self)
S.Scheduler._loop = lp
settings = make_settings(max_document_tokens=4096)
engine = make_engine(settings)
ex = load_nq("/work/shared/data/nq-open-oracle-dev.jsonl.gz")
text = _long_text(ex, engine, 3300, 100)
rt = runtime(engine, max_step_tokens=256, long_prefill_budget=cap, prefix_cache_bytes=0)
rt.documents.ingest(TENANT, "long", text)
while rt.queue.depth(): time.sleep(0.05)
q = rt.queries
for i in range(3):
    t0 = time.perf_counter()
    r = q.answer(q.plan(TENANT, f"{ex[1].question} ({i})", ["long"], mode="full", max_new_tokens=1, temperature=0.0))
    print(cap, f"{time.perf_counter()-t0:.2f}s steps", rt.scheduler.steps if hasattr(rt,'scheduler') else '', flush=True)
rt.close()
import statistics
print("forwards", len(LOG), "sum fwd s", round(sum(x[2] for x in LOG),2), "sum step s", round(sum(STEPS),2))
for x in LOG[-45:]: print(x[0], x[1], round(x[2]*1000))

"""The linked TTFT (link-and-question forward) of the shipped adapter's three prefill paths in one process,
interleaved: float32 terms (before bc228cb), bfloat16 terms (bc228cb), merged into the bfloat16 prefill weights
(db955ab), at 10 cached NQ documents (~1.3k tokens) and ~4k tokens; medians of 15 rounds. JSON to stdout."""
import json, os, statistics, time
import torch
from cli.common import make_engine, make_settings
from evaluation.nq import load_nq
from bench.contexts import documents_for_budget
from kvlink_rag.runtime.lora import FusedLowRank
from kvlink_rag.runtime.model_runner import get_runner
ex = load_nq(os.environ["KVLINK_RAG_NQ_PATH"], limit=2000)
eng = make_engine(make_settings())
MODES = {"float32 terms": None, "bfloat16 terms": torch.bfloat16, "merged": "merged"}
_merged = FusedLowRank.merged
def use(mode):
    want = MODES[mode]
    FusedLowRank.merged = _merged if want == "merged" else (lambda self: None)
    for layer in get_runner(eng.lm)._terms(eng.adapter):
        for t in (layer.qkv, layer.o, layer.gate_up, layer.down):
            if t is not None and t.gemm_dtype != (torch.bfloat16 if want == "merged" else want):
                t.gemm_dtype, t._versions = (torch.bfloat16 if want == "merged" else want), None  # rebuilt
out = {}
for label, docs in (("10 docs", [e.gold for e in ex[:10]]), ("4k tokens", documents_for_budget(eng, ex, 10, 4000, start=1000))):
    for d in docs:
        eng.get_or_encode(d)
    q = ex[0].question
    def ttft():
        t0 = time.perf_counter()
        ctx, _ = eng.link_context(q, docs)
        int(torch.argmax(ctx.last_logits))
        return time.perf_counter() - t0
    times = {m: [] for m in MODES}
    for m in MODES:
        use(m); ttft(); ttft()
    for _ in range(15):
        for m in MODES:
            use(m)
            times[m].append(ttft())
    out[label] = {m: round(statistics.median(v) * 1e3, 1) for m, v in times.items()}
    print(label, out[label], flush=True)
print(json.dumps(out))

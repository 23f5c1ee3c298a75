"""The one-request engine path (CLI ask, eval, the TTFT bench): linked TTFT and an 8-token answer, 1 and 10 cached
NQ documents, medians of 15; JSON line to stdout."""
import json, os, statistics, time
import torch
from cli.common import make_engine, make_settings
from evaluation.nq import load_nq
ex = load_nq(os.environ["KVLINK_RAG_NQ_PATH"], limit=20)
eng = make_engine(make_settings())
out = {}
for n in (1, 10):
    docs = [e.gold for e in ex[:n]]
    for d in docs:
        eng.get_or_encode(d)
    q = ex[0].question
    def ttft():
        t0 = time.perf_counter()
        ctx, _ = eng.link_context(q, docs)
        int(torch.argmax(ctx.last_logits))
        return time.perf_counter() - t0
    def answer():
        t0 = time.perf_counter()
        eng.answer(q, docs, max_new_tokens=8, temperature=0.0, ignore_eos=True)
        return time.perf_counter() - t0
    for f in (ttft, answer):
        f()
    out[f"ttft_ms_{n}"] = statistics.median(ttft() for _ in range(15)) * 1e3
    out[f"answer8_ms_{n}"] = statistics.median(answer() for _ in range(15)) * 1e3
print(json.dumps({k: round(v, 1) for k, v in out.items()}))

"""The encode of the precompute suite's 10 documents under torch's profiler, importance on and off alternating (two
threads): total self CPU time and the largest operators, seconds. Run: .venv/bin/python docs/bench/icelake-2026-12-07b/onoff.py"""
import os, sys, time
from pathlib import Path
import torch
sys.path.insert(0, os.getcwd())
from cli.common import make_engine, make_settings
from kvlink_rag.linking.document_prefill import encode_document
from bench.contexts import documents_for_budget
from evaluation.nq import load_nq
torch.set_num_threads(2)
eng = make_engine(make_settings(chunk_tokens=0))
docs = documents_for_budget(eng, load_nq(Path(os.environ["KVLINK_RAG_NQ_PATH"])), 10, 4000, start=1000)
pre = eng.prefix if eng.anchored else None
ids = [eng.document_ids(d) for d in docs]
from torch.profiler import profile, ProfilerActivity
with torch.inference_mode():
    for x in ids[:2]: encode_document(eng.lm, x, prefix=pre, importance=True)
    for imp in (True, False, True, False):
        with profile(activities=[ProfilerActivity.CPU]) as p:
            for x in ids: encode_document(eng.lm, x, prefix=pre, importance=imp)
        ka = p.key_averages()
        tot = sum(e.self_cpu_time_total for e in ka) / 1e6
        top = sorted(ka, key=lambda e: -e.self_cpu_time_total)[:7]
        print("importance", imp, "total %.2f s |" % tot, ", ".join("%s %.2f" % (e.key.replace("aten::", ""), e.self_cpu_time_total / 1e6) for e in top))

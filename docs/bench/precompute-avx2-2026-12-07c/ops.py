"""Where the precompute suite's encode spends its time against transformers' raw forward, op by op (torch profiler,
the suite's 10 documents, 4,099 tokens, one pass each after a warm-up pass; two threads).
Run from the repository root: .venv/bin/python docs/bench/precompute-avx2-2026-12-07c/ops.py"""
import os
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.getcwd())
from bench.contexts import documents_for_budget  # noqa: E402
from cli.common import make_engine, make_settings  # noqa: E402
from evaluation.nq import load_nq  # noqa: E402

torch.set_num_threads(2)
eng = make_engine(make_settings(chunk_tokens=0))
docs = documents_for_budget(eng, load_nq(Path(os.environ["KVLINK_RAG_NQ_PATH"])), 10, 4000, start=1000)
ids = [eng.document_ids(d) for d in docs]
with torch.inference_mode():
    for d, i in zip(docs, ids):  # warm-up
        eng.lm.decoder(input_ids=i[None], use_cache=True)
        eng.encode(d)
    for name, run in (("raw forward", lambda: [eng.lm.decoder(input_ids=i[None], use_cache=True) for i in ids]),
                      ("encode", lambda: [eng.encode(d) for d in docs])):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
        print(f"== {name}")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))

"""Ten short NQ documents (the precompute suite's) encoded by transformers or the runner, importance on/off (short_docs.txt).
    .venv/bin/python docs/bench/importance-lse-2026-12-07/short_docs.py"""
import os, sys, time, statistics
from pathlib import Path
sys.path.insert(0, ".")  # run from the repository root
import torch
import kvlink_rag.linking.document_prefill as dp
import kvlink_rag.runtime.model_runner as mr
from kvlink_rag.runtime.ragged import attend
from cli.common import make_engine, make_settings
from kvlink_rag.cache import MemoryCache
from evaluation.nq import load_nq
from bench.contexts import documents_for_budget
ex = load_nq(Path(os.environ.get("KVLINK_RAG_NQ_PATH", "../shared/data/nq-open-oracle-dev.jsonl.gz")))
orig_lse = mr.attend_with_lse
engine = make_engine(make_settings(importance_scores=True), cache=MemoryCache()).with_chunk_tokens(0)
docs = documents_for_budget(engine, ex, 10, 4000, start=1000)
noimp = make_engine(make_settings(importance_scores=False), cache=MemoryCache()).with_chunk_tokens(0)
variants = {"transformers": (False, True), "runner": (True, True), "runner-no-lse": (True, "nolse"), "runner-noimp": (True, False), "transformers-noimp": (False, False)}
for rnd in range(2):
    for name, (runner, imp) in variants.items():
        dp.on_runner = (lambda lm: True) if runner else (lambda lm: False)
        mr.attend_with_lse = orig_lse if imp != "nolse" else (lambda q, p, m, s, c=False: (attend(q, p, m, s, c), None))
        e = engine if imp else noimp
        with torch.inference_mode():
            t = time.perf_counter()
            for d in docs: e.encode(d)
            el = time.perf_counter() - t
        print(f"round {rnd} {name}: {el*1e3:.0f} ms for 10 docs", flush=True)

"""Encode times of one document with importance: the attention LSE used or not, and without scores (see lse_or_not.txt).
    .venv/bin/python docs/bench/importance-lse-2026-12-07/lse_or_not.py TOKENS [CHUNK_TOKENS]"""
import os, sys, time
from pathlib import Path
sys.path.insert(0, ".")  # run from the repository root
import torch
import kvlink_rag.runtime.model_runner as mr
from kvlink_rag.runtime.ragged import attend
from cli.common import make_engine, make_settings
from kvlink_rag.cache import MemoryCache
from evaluation.nq import load_nq
from bench.chunk_edit import long_text
ex = load_nq(Path(os.environ.get("KVLINK_RAG_NQ_PATH", "../shared/data/nq-open-oracle-dev.jsonl.gz")))
orig_lse = mr.attend_with_lse
n = int(sys.argv[1])
engine = make_engine(make_settings(importance_scores=True), cache=MemoryCache()).with_chunk_tokens(0)
noimp = make_engine(make_settings(importance_scores=False), cache=MemoryCache()).with_chunk_tokens(0)
doc = long_text(engine, ex, n)
chunk = int(sys.argv[2]) if len(sys.argv) > 2 else 0
engine, noimp = engine.with_chunk_tokens(chunk), noimp.with_chunk_tokens(chunk)
for name in ("lse", "no-lse", "noimp", "lse", "no-lse"):
    mr.attend_with_lse = orig_lse if name == "lse" else (lambda q, p, m, s, c=False: (attend(q, p, m, s, c), None))
    e = make_engine(make_settings(importance_scores=name != "noimp"), cache=MemoryCache()).with_chunk_tokens(chunk)
    with torch.inference_mode():
        t = time.perf_counter(); e.warm(doc); el = time.perf_counter() - t
    print(f"{n} tokens chunk {chunk} {name}: {el:.1f} s", flush=True)

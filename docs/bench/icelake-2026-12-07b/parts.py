"""The precompute suite's 10 documents part by part (two threads; R rounds): transformers' raw forward, the
engine's encode (importance on, the service's default), the store write, and encode_document with importance off.
Run at a commit: (cd CHECKOUT && R=3 /work/main/.venv/bin/python /work/main/docs/bench/icelake-2026-12-07b/parts.py)"""
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.getcwd())
from bench.contexts import documents_for_budget  # noqa: E402
from cli.common import make_engine, make_settings  # noqa: E402
from evaluation.nq import load_nq  # noqa: E402
from kvlink_rag.linking.document_prefill import encode_document  # noqa: E402
from store.factory import open_store  # noqa: E402

torch.set_num_threads(2)
s = make_settings(chunk_tokens=0)
eng = make_engine(s)
docs = documents_for_budget(eng, load_nq(Path(os.environ["KVLINK_RAG_NQ_PATH"])), 10, 4000, start=1000)
pre = eng.prefix if eng.anchored else None
print("weight format", eng.lm.weight_format, "| documents", len(docs), "| tokens",
      sum(int(eng.document_ids(d).numel()) for d in docs))
tot: dict[str, float] = {}


def tm(k, f):
    t = time.perf_counter()
    out = f()
    tot[k] = tot.get(k, 0.0) + time.perf_counter() - t
    return out


R = int(os.environ.get("R", "3"))
with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
    st = open_store(s.model_copy(update={"home": Path(tmp)}))
    for _ in range(R):
        for i, d in enumerate(docs):
            ids = eng.document_ids(d)
            tm("raw forward", lambda: eng.lm.decoder(input_ids=ids[None], use_cache=True))
            kv = tm("encode, importance on", lambda: eng.encode(d))
            tm("store write", lambda: st.blobs.put(f"x{i}", kv))
            tm("encode, importance off", lambda: encode_document(eng.lm, ids, prefix=pre, importance=False))
for k, v in tot.items():
    print(f"{k:24s} {v / R:6.3f} s")
print(f"raw / (encode + write) {tot['raw forward'] / (tot['encode, importance on'] + tot['store write']):.3f}")

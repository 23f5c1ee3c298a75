"""The precompute suite's store write for its 10 documents (bfloat16, importance-ordered records) in two parts: the
record's encoding (rows in retention order, safetensors, checksums) and the LMDB write (put_record: the transaction
and its commit); three rounds, each under new keys.
Run: .venv/bin/python docs/bench/icelake-2026-12-07b/store_write.py"""
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
from store.blobs.blob_store import encode_record  # noqa: E402
from store.factory import open_store  # noqa: E402

torch.set_num_threads(2)
s = make_settings(chunk_tokens=0)
eng = make_engine(s)
docs = documents_for_budget(eng, load_nq(Path(os.environ["KVLINK_RAG_NQ_PATH"])), 10, 4000, start=1000)
with torch.inference_mode():
    kvs = [eng.encode(d) for d in docs]
with tempfile.TemporaryDirectory() as tmp:
    st = open_store(s.model_copy(update={"home": Path(tmp)}))
    for r in range(3):
        t = time.perf_counter()
        records = [encode_record(kv, False, True) for kv in kvs]
        enc = time.perf_counter() - t
        t = time.perf_counter()
        for i, rec in enumerate(records):
            st.blobs.put_record(f"d{r}-{i}", rec)
        print(f"round {r}: encode_record {enc * 1e3:.0f} ms, put_record {(time.perf_counter() - t) * 1e3:.0f} ms "
              f"(10 documents)")

"""The precompute suite's store write split in two (session 2026-12-07d, AVX512-BF16 EPYC, two threads, 3 rounds of the
10 documents, ~4.1k tokens): transformers' raw forward beside encode_record (the codec: importance order, checksums)
and put_record (the LMDB transaction, fsync on commit), and the whole put. Run from the repository root with
TD=/root (a temporary store on disk, not tmpfs): python docs/bench/store-write-2026-12-07d/split.py"""
import os, sys, tempfile, time
from pathlib import Path
import torch
sys.path.insert(0, os.getcwd())
from bench.contexts import documents_for_budget
from cli.common import make_engine, make_settings
from evaluation.nq import load_nq
from store.factory import open_store
from store.blobs.blob_store import encode_record
torch.set_num_threads(2)
s = make_settings(chunk_tokens=0)
eng = make_engine(s)
docs = documents_for_budget(eng, load_nq(Path(os.environ["KVLINK_RAG_NQ_PATH"])), 10, 4000, start=1000)
tot = {}
def tm(k, f):
    t = time.perf_counter(); out = f(); tot[k] = tot.get(k, 0.0) + time.perf_counter() - t; return out
with tempfile.TemporaryDirectory(dir=os.environ.get("TD")) as tmp, torch.inference_mode():
    st = open_store(s.model_copy(update={"home": Path(tmp)}))
    kvs = [eng.encode(d) for d in docs]
    for r in range(3):
        for i, kv in enumerate(kvs):
            tm("raw forward", lambda: eng.lm.decoder(input_ids=eng.document_ids(docs[i])[None], use_cache=True))
            rec = tm("encode_record", lambda: encode_record(kv))
            tm("put_record", lambda: st.blobs.put_record(f"x{i}", rec))
            tm("put (whole)", lambda: st.blobs.put(f"y{i}", kv))
for k, v in tot.items():
    print(f"{k:24s} {v / 3:6.3f} s")

"""Does the encode lose to the raw forward only when they alternate? The suite's 10 documents (4,099 tokens) timed
(a) alternating raw / encode per document, as the precompute suite does, (b) all raw forwards then all encodes, each
pass twice; two threads. Run from the repository root: .venv/bin/python docs/bench/precompute-avx2-2026-12-07c/order.py"""
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.getcwd())
from bench.contexts import documents_for_budget  # noqa: E402
from cli.common import make_engine, make_settings  # noqa: E402
from evaluation.nq import load_nq  # noqa: E402

torch.set_num_threads(2)
eng = make_engine(make_settings(chunk_tokens=0))
docs = documents_for_budget(eng, load_nq(Path(os.environ["KVLINK_RAG_NQ_PATH"])), 10, 4000, start=1000)
ids = [eng.document_ids(d) for d in docs]


def raw(i):
    eng.lm.decoder(input_ids=ids[i][None], use_cache=True)


def enc(i):
    eng.encode(docs[i])


def timed(f, i, acc, k):
    t = time.perf_counter()
    f(i)
    acc[k] = acc.get(k, 0.0) + time.perf_counter() - t


with torch.inference_mode():
    for rnd in range(2):
        acc = {}
        for i in range(len(docs)):
            timed(raw, i, acc, "raw")
            timed(enc, i, acc, "encode")
        print(f"alternating, pass {rnd}: raw {acc['raw']:.2f} s, encode {acc['encode']:.2f} s, raw/encode {acc['raw'] / acc['encode']:.3f}", flush=True)
        acc = {}
        for i in range(len(docs)):
            timed(raw, i, acc, "raw")
        for i in range(len(docs)):
            timed(enc, i, acc, "encode")
        print(f"grouped, pass {rnd}: raw {acc['raw']:.2f} s, encode {acc['encode']:.2f} s, raw/encode {acc['raw'] / acc['encode']:.3f}", flush=True)

"""Pre-encoding side by side: documents one forward each (``Engine.warm``, the path before) against several packed
into one forward of at most MAX_TOKENS tokens (``Engine.warm_many``), on the default model and its default weight
format, importance scores on (what the mixture recipe encodes with), fresh in-memory caches, interleaved rounds.

    KVLINK_RAG_NQ_PATH=... python docs/bench/preencode-2026-12-06/preencode_ab.py [ROUNDS] > out.json
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from cli.common import doc_cache_engine, make_settings
from evaluation.nq import build_documents, load_nq
from kvlink_rag.cache import MemoryCache
from training import kv_retrieval as kv

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
N_NQ, N_KV = 48, 48


def documents():
    exs = load_nq(os.environ["KVLINK_RAG_NQ_PATH"], 400)
    nq = [d for i in range(200, 400) for d in build_documents(exs, i, 1)[0]][:N_NQ]
    kvd = [d for i in range(N_KV // 4) for d in kv.build_documents(kv.make_examples(N_KV // 4, 4, seed=7001), i, 4)[0]]
    return nq + kvd[:N_KV]


def main() -> None:
    eng = doc_cache_engine(make_settings(5, "isolated", shipped_links=False, importance_scores=True), False)
    docs = documents()
    tokens = sum(int(eng.document_ids(d).numel()) for d in docs)
    eng.warm(docs[0])  # first-call costs (kernels, tables) out of the timings
    runs = {"one_by_one": [], "packed_2048": [], "packed_4096": []}
    for _ in range(ROUNDS):
        for name in runs:
            eng.cache = MemoryCache()
            t0 = time.perf_counter()
            if name == "one_by_one":
                for d in docs:
                    eng.warm(d)
            else:
                eng.warm_many(docs, max_tokens=int(name.split("_")[1]))
            runs[name].append(time.perf_counter() - t0)
    best = {k: min(v) for k, v in runs.items()}
    print(json.dumps({"documents": len(docs), "tokens": tokens, "threads": torch.get_num_threads(),
                      "weight_format": eng.lm.weight_format, "seconds": runs,
                      "ms_per_document_best": {k: 1000 * v / len(docs) for k, v in best.items()},
                      "speedup_vs_one_by_one": {k: best["one_by_one"] / v for k, v in best.items()}}, indent=1))


if __name__ == "__main__":
    main()

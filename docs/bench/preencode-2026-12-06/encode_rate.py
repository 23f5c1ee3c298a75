"""Document pre-encoding rate on the default model and its default weight format (q4q8-bf16 here: the runner's
bfloat16 prefill), 40 NQ passages one forward each, without and with importance scores (session 2026-12-06c,
AMX Xeon, 2 torch threads, nothing else running). Printed:
    format q4q8-bf16 on_runner True importance False threads 2 -> 60 ms/doc, 119 tok/doc, 1985 tok/s
    format q4q8-bf16 on_runner True importance True threads 2  -> 70 ms/doc, 119 tok/doc, 1694 tok/s

    KVLINK_RAG_NQ_PATH=... PYTHONPATH=. python docs/bench/preencode-2026-12-06/encode_rate.py
"""
import time, os, torch
from cli.common import doc_cache_engine, make_settings
from evaluation.nq import load_nq, build_documents
from kvlink_rag.linking.document_prefill import on_runner
for imp in (False, True):
    s = make_settings(5, "isolated", shipped_links=False, importance_scores=imp)
    eng = doc_cache_engine(s, False)
    print("format", eng.lm.weight_format, "on_runner", on_runner(eng.lm), "importance", imp, "threads", torch.get_num_threads())
    exs = load_nq(os.environ["KVLINK_RAG_NQ_PATH"], 200)
    docs = []
    for i in range(0, 40):
        docs += build_documents(exs, i, 2)[0]
    eng.encode(docs[0])
    t0 = time.perf_counter(); toks = 0
    for d in docs[1:41]:
        toks += int(eng.document_ids(d).numel()); eng.encode(d)
    dt = time.perf_counter() - t0
    print(f"{dt/40*1000:.0f} ms/doc, {toks/40:.0f} tok/doc, {toks/dt:.0f} tok/s")

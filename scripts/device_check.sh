#!/usr/bin/env bash
# The one prepared GPU check of issue 24 (run on a lent device machine from the repo root, within ~10 min on
# one H200): exactness on CUDA, verify (batched vs one-at-a-time), the engine bench and bench --device cuda at
# 1k-8k contexts. Outputs land under $OUT (the device tool brings them back). The venv and the converted
# model must be there already (carry them, see /work/.library/device); nothing here downloads.
set -uo pipefail
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
export KVLINK_RAG_DEVICE=cuda KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
PY=.venv/bin/python
KV=.venv/bin/kvlink-rag
step() { echo "== $1 ($(date +%T))"; }
step "exactness on CUDA (1e-4 float32 against transformers)"
timeout 120 $PY -m pytest -q tests/kvlink_rag/test_cuda_exact.py tests/kvlink_rag/runtime -p no:cacheprovider \
  2>&1 | tail -5 | tee "$OUT/exact.txt"
step "verify on CUDA (float32)"
KVLINK_RAG_COMPUTE_DTYPE=float32 timeout 150 $KV verify --questions 8 --docs 10 --json "$OUT/verify.json" \
  2>&1 | tail -8 | tee "$OUT/verify.txt"
step "engine bench on CUDA (bfloat16 compute, native weights)"
KVLINK_RAG_COMPUTE_DTYPE=bfloat16 timeout 120 $KV bench-engine --formats native --repeats 2 \
  --json "$OUT/engine.json" 2>/dev/null | tee "$OUT/engine.md"
step "bench --device cuda: TTFT at 1k-8k contexts, batch 1 and 16 clients"
timeout 240 $KV bench --device cuda --suites ttft,concurrency --lengths 1000,2000,4000,8000 --clients 1,16 \
  --requests 32 --repeats 2 --json "$OUT/bench.json" 2>/dev/null | tee "$OUT/bench.md"
step "done"

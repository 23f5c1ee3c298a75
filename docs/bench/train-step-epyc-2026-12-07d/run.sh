#!/bin/bash
# Issue 28 item 2 on the AVX512-BF16 EPYC (session 2026-12-07d): seconds per step today (float32 SDPA) against the
# own packed bfloat16 step, side by side, interleaved step by step; two threads, nothing else running.
# Usage (repository root): bash docs/bench/train-step-epyc-2026-12-07d/run.sh OUTDIR
set -u
O=$(realpath -m $1); mkdir -p $O
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz KVLINK_RAG_TORCH_THREADS=2
PYTHONPATH=. .venv/bin/python scripts/bench_train_step.py --steps 5 --accumulate 4 --val-n 20 \
  --variants today,bf16+pack+own --json $O/train-step.json > $O/train-step.log 2>&1
echo DONE > $O/done

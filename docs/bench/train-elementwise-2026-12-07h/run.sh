#!/bin/bash
# Issue 28 item 2 (session 2026-12-07h, AMD EPYC with AVX512-BF16, no AMX): seconds per step today (float32 SDPA)
# against the own packed bfloat16 step with its elementwise steps in torch ops (the step before this session) and
# with the elementwise kernels (training/elementwise.py), interleaved step by step in one process; two threads,
# nothing else running. Usage (repository root): bash docs/bench/train-elementwise-2026-12-07h/run.sh OUTDIR [STEPS]
set -u
O=$(realpath -m $1); mkdir -p $O
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz KVLINK_RAG_TORCH_THREADS=2
PYTHONPATH=. .venv/bin/python scripts/bench_train_step.py --steps ${2:-5} --accumulate 4 --val-n 20 \
  --variants today,bf16+pack+own-torch-ew,bf16+pack+own --json $O/train-step.json > $O/train-step.log 2>&1
echo DONE > $O/done

#!/bin/bash
# Issue 28 item 2 on AMX: the packed training step with its GEMM rows rounded up to 32 (default) against the
# rows as they are (-rows1) and against today's loop, interleaved in one run; two torch threads, nothing else
# running. Run from the repository root at 66e6667 only (the -rows1 variant and row_bucket were reverted after it).
set -e
export KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz} KVLINK_RAG_TORCH_THREADS=2
D=docs/bench/train-rows-2026-12-06i
lscpu | grep -E "Model name|Flags" | sed 's/Flags:.*\(amx_bf16\).*/AMX: \1/' > $D/cpu.txt
for steps in 4 12; do
  PYTHONPATH=. .venv/bin/python scripts/bench_train_step.py --steps $steps --accumulate 4 --val-n 5 \
    --variants today,bf16+pack+own,bf16+pack+own-rows1 --json $D/steps$steps.json 2>&1 | grep -v Warning | tee $D/steps$steps.log
done

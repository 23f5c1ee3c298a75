#!/bin/bash
# The default format (q4q8-bf16) on an AMX Xeon, where prefill rows now attend by torch SDPA (AMX tiles) instead
# of the AVX512-BF16 kernel: first 300 dev questions, 10 documents, rotate, the shipped adapter; two processes of
# one torch thread (questions 0-149, 150-299).
# Usage (repository root): bash docs/eval/sdpa-amx-2026-12-08/commands.sh
set -u
D=docs/eval/sdpa-amx-2026-12-08
export KVLINK_RAG_WEIGHT_FORMAT=q4q8-bf16 KVLINK_RAG_TORCH_THREADS=1
A=kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors
for s in 0 150; do
  .venv/bin/kvlink-rag eval --nq /work/shared/data/nq-open-oracle-dev.jsonl.gz --n $((s + 150)) --start $s \
    --gold-position rotate --modes full,linked-query-lora --adapter $A --tag sdpaamx --json $D/eval-$s.json \
    > $D/eval-$s.log 2>&1 &
done
wait
echo DONE > $D/done

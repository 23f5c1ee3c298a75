#!/bin/bash
# issue 28 (session 2026-12-06g, AMX Xeon): one block (chunking off) on the same 300 questions and machine as
# eval_lanes.sh, so the pairs do not cross machines (2026-12-06e's one-block rows were the AVX512 EPYC's).
#   bash docs/eval/chunk-cache-2026-12-06g/block_lanes.sh
set -u
export KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
D=$(dirname "$0")
for START in 0 150; do
  ${KV:-.venv/bin/kvlink-rag} eval --gold-position rotate --start $START --n $((START + 150)) --task long-docs --docs 20 \
    --modes linked-query-lora --adapter kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors \
    --chunk-tokens 0 --tag amx --json $D/long-block-$START.json > $D/long-block-$START.log 2>&1 &
done
wait

#!/bin/bash
# issue 28 (session 2026-12-06g, AMX Xeon): the default chunk encoding (each chunk after the text of the one chunk
# before it, KVLINK_RAG_CHUNK_CONTEXT_FROM=text) in the same layout as eval_lanes.sh (CHUNK_LINKS=last,
# CHUNK_FRAMES=first), same 300 questions and machine: what reading the caches of every chunk before changes.
#   bash docs/eval/chunk-cache-2026-12-06g/text_lanes.sh
set -u
export KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
D=$(dirname "$0")
for START in 0 150; do
  KVLINK_RAG_CHUNK_CONTEXT=1 KVLINK_RAG_CHUNK_CONTEXT_FROM=text KVLINK_RAG_CHUNK_LINKS=last KVLINK_RAG_CHUNK_FRAMES=first \
    ${KV:-.venv/bin/kvlink-rag} eval --gold-position rotate \
    --start $START --n $((START + 150)) --task long-docs --docs 20 --modes linked-query-lora \
    --adapter kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors --chunk-tokens 512 --tag text \
    --json $D/long-text-$START.json > $D/long-text-$START.log 2>&1 &
done
wait

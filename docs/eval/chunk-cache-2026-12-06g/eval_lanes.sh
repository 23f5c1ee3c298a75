#!/bin/bash
# issue 28 (session 2026-12-06g, AMX Xeon): chunked long documents, each chunk encoded after the stored caches of
# every chunk before it (KVLINK_RAG_CHUNK_CONTEXT_FROM=cache), no link tokens or frames between the chunks of one
# document (CHUNK_LINKS=last, CHUNK_FRAMES=first), the shipped artifact, first 300 dev questions, rotate; paired
# against docs/eval/chunk-context-2026-12-06e (one block, chunks in context) and chunk-links-2026-12-06f (the same
# layout with each chunk after the text of one chunk). Two lanes side by side, one torch thread each.
#   bash docs/eval/chunk-cache-2026-12-06g/eval_lanes.sh
set -u
export KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
D=$(dirname "$0")
for START in 0 150; do
  KVLINK_RAG_CHUNK_CONTEXT=1 KVLINK_RAG_CHUNK_CONTEXT_FROM=cache KVLINK_RAG_CHUNK_LINKS=last KVLINK_RAG_CHUNK_FRAMES=first \
    ${KV:-.venv/bin/kvlink-rag} eval --gold-position rotate \
    --start $START --n $((START + 150)) --task long-docs --docs 20 --modes linked-query-lora \
    --adapter kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors --chunk-tokens 512 --tag cache \
    --json $D/long-cache-$START.json > $D/long-cache-$START.log 2>&1 &
done
wait

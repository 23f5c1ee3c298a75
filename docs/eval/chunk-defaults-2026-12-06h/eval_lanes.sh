#!/bin/bash
# issue 28 (session 2026-12-06h): chunked long documents with the chunk settings at their new defaults (no
# KVLINK_RAG_CHUNK_* set: each chunk after the stored caches of every chunk before it, frame before the first chunk
# only, link tokens after the last), the shipped artifact, first 300 dev questions, rotate: the same run as
# docs/eval/chunk-cache-2026-12-06g/eval_lanes.sh with its settings given explicitly, whose rows these must repeat.
# --chunk-tokens 512 (the engine's default chunk size) runs the chunked mode only (eval's long-docs sweep is 0,512
# unless told; the first 15 questions of each lane also hold one-block rows from a first start without it).
# Two lanes side by side, one torch thread each.   bash docs/eval/chunk-defaults-2026-12-06h/eval_lanes.sh
set -u
unset KVLINK_RAG_CHUNK_CONTEXT KVLINK_RAG_CHUNK_CONTEXT_FROM KVLINK_RAG_CHUNK_LINKS KVLINK_RAG_CHUNK_FRAMES KVLINK_RAG_CHUNK_TOKENS
export KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
D=$(dirname "$0")
for START in 0 150; do
  ${KV:-.venv/bin/kvlink-rag} eval --gold-position rotate \
    --start $START --n $((START + 150)) --task long-docs --docs 20 --modes linked-query-lora \
    --adapter kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors --chunk-tokens 512 --tag defaults \
    --json $D/long-defaults-$START.json > $D/long-defaults-$START.log 2>&1 &
done
wait

#!/bin/bash
# issue 28 (session 2026-12-06f, AVX512-BF16 EPYC): chunked long documents linked with link tokens only after a
# document's last chunk (KVLINK_RAG_CHUNK_LINKS=last), each chunk encoded after the one before it (chunk_context 1),
# the shipped artifact (linked-query-lora), first 300 dev questions, rotate; paired against the rows of
# docs/eval/chunk-context-2026-12-06e (one block, chunks in context with link tokens after each chunk, alone).
# Two lanes side by side, one torch thread each.   bash eval_lanes.sh
set -u
export KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
D=$(dirname "$0")
for START in 0 150; do
  KVLINK_RAG_CHUNK_CONTEXT=1 KVLINK_RAG_CHUNK_LINKS=last ${KV:-.venv/bin/kvlink-rag} eval --gold-position rotate \
    --start $START --n $((START + 150)) --task long-docs --docs 20 --modes linked-query-lora \
    --adapter kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors --chunk-tokens 512 --tag last \
    --json $D/long-last-$START.json > $D/long-last-$START.log 2>&1 &
done
wait

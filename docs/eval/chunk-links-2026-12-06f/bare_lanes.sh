#!/bin/bash
# issue 28 (session 2026-12-06f, AVX512-BF16 EPYC): chunked long documents read as the whole document - chunks after
# the first without the document frame (KVLINK_RAG_CHUNK_FRAMES=first) and no link tokens between chunks
# (KVLINK_RAG_CHUNK_LINKS=last), each chunk encoded after the WINDOW chunks before it (chunk_context, default 1; 64:
# every chunk before it, so the chunks' values are the whole document's); the shipped artifact, dev questions
# 0..2*SPAN-1 (default 300), rotate; paired against docs/eval/chunk-context-2026-12-06e's rows and eval_lanes.sh's.
# Two lanes side by side, one torch thread each.   bash bare_lanes.sh;  WINDOW=64 SPAN=75 bash bare_lanes.sh
set -u
LINKS=${LINKS:-last}; WINDOW=${WINDOW:-1}; SPAN=${SPAN:-150}
TAG=bare-$LINKS; [ "$WINDOW" = 1 ] || TAG=$TAG-w$WINDOW
export KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
D=$(dirname "$0")
for START in 0 $SPAN; do
  KVLINK_RAG_CHUNK_CONTEXT=$WINDOW KVLINK_RAG_CHUNK_LINKS=$LINKS KVLINK_RAG_CHUNK_FRAMES=first ${KV:-.venv/bin/kvlink-rag} \
    eval --gold-position rotate --start $START --n $((START + SPAN)) --task long-docs --docs 20 \
    --modes linked-query-lora --adapter kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors \
    --chunk-tokens 512 --tag $TAG --json $D/long-$TAG-$START.json > $D/long-$TAG-$START.log 2>&1 &
done
wait

#!/bin/bash
# Chunks encoded after the text of W chunks before them (KVLINK_RAG_CHUNK_CONTEXT=W), the shipped artifact, dev
# questions START..END-1, chunks of 512 only (one block and W=0/1 are long-*.rows.jsonl); one torch thread.
#   bash window_lanes.sh 2 0 150 & bash window_lanes.sh 2 150 300
set -u
W=$1; START=$2; END=$3
export KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
D=$(dirname "$0")
KVLINK_RAG_CHUNK_CONTEXT=$W ${KV:-.venv/bin/kvlink-rag} eval --gold-position rotate --start $START --n $END \
  --task long-docs --docs 20 --modes linked-query-lora --adapter kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors \
  --chunk-tokens 512 --tag ctx$W --json $D/long-ctx$W-$START.json > $D/long-ctx$W-$START.log 2>&1

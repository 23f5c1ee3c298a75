#!/bin/bash
# The same comparison as eval_lanes.sh on dev questions START..START+99 (--n is the end) (one lane per call, one torch thread):
#   bash more_lanes.sh ctx 100   |   bash more_lanes.sh alone 100
set -u
# (ran with KVLINK_RAG_CHUNK_CONTEXT=true/false while the setting was a bool; 1/0 are the same now)
WHICH=$1; START=$2
export KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
D=$(dirname "$0")
E="${KV:-.venv/bin/kvlink-rag} eval --gold-position rotate --start $START --n $((START + 100)) --task long-docs --docs 20 --modes linked-query-lora --adapter kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors"
case $WHICH in
  ctx) KVLINK_RAG_CHUNK_CONTEXT=1 $E --chunk-tokens 0,512 --tag ctx --json $D/long-ctx-$START.json > $D/long-ctx-$START.log 2>&1 ;;
  alone) KVLINK_RAG_CHUNK_CONTEXT=0 $E --chunk-tokens 512 --tag alone --json $D/long-alone-$START.json > $D/long-alone-$START.log 2>&1 ;;
esac

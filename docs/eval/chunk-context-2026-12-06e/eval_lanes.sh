#!/bin/bash
# issue 28 (session 2026-12-06e, AVX512-BF16 EPYC): chunked long documents with each chunk encoded after the chunk
# before it (chunk_context on) against chunks encoded alone (off), the shipped artifact (linked-query-lora), 100 dev questions, rotate.
# Two lanes side by side, one torch thread each.   bash eval_lanes.sh
# (ran with KVLINK_RAG_CHUNK_CONTEXT=true/false while the setting was a bool; 1/0 are the same now)
set -u
N=${N:-100}
export KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
D=$(dirname "$0")
E="${KV:-.venv/bin/kvlink-rag} eval --gold-position rotate --n $N --task long-docs --docs 20 --modes linked-query-lora --adapter kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors"
KVLINK_RAG_CHUNK_CONTEXT=1 $E --chunk-tokens 0,512 --tag ctx --json $D/long-ctx.json > $D/long-ctx.log 2>&1 &
KVLINK_RAG_CHUNK_CONTEXT=0 $E --chunk-tokens 512 --tag alone --json $D/long-alone.json > $D/long-alone.log 2>&1 &
wait

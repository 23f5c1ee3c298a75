#!/bin/bash
# Issue 28 (session 2026-12-06i, AMX Xeon): key-value retrieval over 10 documents with CacheBlend recompute on top of
# the shipped link tokens and adapter (ratios 0.15, 0.3; 0 = linked itself) beside full prefill, the first 100
# generated questions (as EVALUATION's kv10 rows), gold rotated; two lanes of one torch thread: bash lanes.sh 1 & bash lanes.sh 2
cd "$(dirname "$0")/../../.."
export KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz} KVLINK_RAG_TORCH_THREADS=1
A=kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors
D=docs/eval/kv-blend-2026-12-06i
if [ "$1" = 1 ]; then S=0; N=50; else S=50; N=100; fi
.venv/bin/kvlink-rag eval --gold-position rotate --start $S --n $N --task kv-retrieval --max-new-tokens 100 --docs 10 \
  --modes full,linked-query-lora --recompute-ratio 0,0.15,0.3 --adapter $A --json $D/kv10-blend-$S.json > $D/kv10-blend-$S.log 2>&1

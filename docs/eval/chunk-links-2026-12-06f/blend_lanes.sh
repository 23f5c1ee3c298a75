#!/bin/bash
# issue 28 (session 2026-12-06f, AVX512-BF16 EPYC): chunked long documents (chunks of 512 in context, link tokens
# after each chunk: the defaults) with CacheBlend recomputing a fraction of the document tokens in the joined
# context (--recompute-ratio; the tokens whose values deviate most, kvlink_rag/reuse/blend.py), the shipped artifact,
# first 300 dev questions, rotate; paired against docs/eval/chunk-context-2026-12-06e's rows.
# Two lanes side by side, one torch thread each.   RATIO=0.1 bash blend_lanes.sh
set -u
RATIO=${RATIO:-0.1}
export KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
D=$(dirname "$0")
for START in 0 150; do
  ${KV:-.venv/bin/kvlink-rag} eval --gold-position rotate --start $START --n $((START + 150)) --task long-docs \
    --docs 20 --modes linked-query-lora --adapter kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors \
    --chunk-tokens 512 --recompute-ratio $RATIO --tag ctx --json $D/long-blend$RATIO-$START.json \
    > $D/long-blend$RATIO-$START.log 2>&1 &
done
wait

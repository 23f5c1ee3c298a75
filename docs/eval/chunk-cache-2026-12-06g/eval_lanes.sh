#!/bin/bash
# issue 28 (session 2026-12-06g, AMX Xeon): chunked long documents, each chunk encoded after the stored caches of
# every chunk before it (FROM=cache, the default here: KVLINK_RAG_CHUNK_CONTEXT_FROM=cache) or after the text of the
# one chunk before it (FROM=text, text_lanes.sh), no link tokens or frames between the chunks of one document
# (CHUNK_LINKS=last, CHUNK_FRAMES=first), the shipped artifact, first 300 dev questions, rotate; paired against
# block_lanes.sh (one block, same machine). Two lanes side by side, one torch thread each.
#   [FROM=text] bash docs/eval/chunk-cache-2026-12-06g/eval_lanes.sh
set -u
FROM=${FROM:-cache}
export KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
D=$(dirname "$0")
for START in 0 150; do
  KVLINK_RAG_CHUNK_CONTEXT=1 KVLINK_RAG_CHUNK_CONTEXT_FROM=$FROM KVLINK_RAG_CHUNK_LINKS=last KVLINK_RAG_CHUNK_FRAMES=first \
    ${KV:-.venv/bin/kvlink-rag} eval --gold-position rotate \
    --start $START --n $((START + 150)) --task long-docs --docs 20 --modes linked-query-lora \
    --adapter kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors --chunk-tokens 512 --tag $FROM \
    --json $D/long-$FROM-$START.json > $D/long-$FROM-$START.log 2>&1 &
done
wait

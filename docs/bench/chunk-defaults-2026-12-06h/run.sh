#!/bin/bash
# issue 28 (session 2026-12-06h, AMX Xeon): bench-edit at the service's defaults after the chunk defaults changed
# (no KVLINK_RAG_CHUNK_* set: each chunk after the stored caches of every chunk before it; importance scores on, as
# precompute runs them), the chunked part and the same document as one block; two torch threads, nothing else
# running, one after the other in one run.   bash docs/bench/chunk-defaults-2026-12-06h/run.sh
set -u
unset KVLINK_RAG_CHUNK_CONTEXT KVLINK_RAG_CHUNK_CONTEXT_FROM KVLINK_RAG_CHUNK_LINKS KVLINK_RAG_CHUNK_FRAMES KVLINK_RAG_CHUNK_TOKENS
D=$(dirname "$0")
export KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
for PART in chunked block; do
  .venv/bin/kvlink-rag bench-edit --nq "$KVLINK_RAG_NQ_PATH" --parts $PART --json $D/edit-$PART.json \
    > $D/edit-$PART.md 2> $D/edit-$PART.log
done

#!/bin/bash
# issue 28 / 24 (session 2026-12-06i, AMX Xeon): bench-edit of the chunked part at the service's defaults (each chunk
# after the stored caches of every chunk before it), each past built anew (before.py: the code before) against the
# growing past of a chunk walk (now), with importance scores on (as precompute runs them) and off; two torch threads,
# nothing else running, one after the other in one run.   bash docs/bench/chunk-walk-2026-12-06i/run.sh
set -u
unset KVLINK_RAG_CHUNK_CONTEXT KVLINK_RAG_CHUNK_CONTEXT_FROM KVLINK_RAG_CHUNK_LINKS KVLINK_RAG_CHUNK_FRAMES KVLINK_RAG_CHUNK_TOKENS
D=$(dirname "$0")
export KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
for IMP in "" "--no-importance"; do
  TAG=${IMP:+-noimp}
  PYTHONPATH=. .venv/bin/python $D/before.py bench-edit --nq "$KVLINK_RAG_NQ_PATH" --parts chunked $IMP \
    --json $D/before$TAG.json > $D/before$TAG.md 2> $D/before$TAG.log
  .venv/bin/kvlink-rag bench-edit --nq "$KVLINK_RAG_NQ_PATH" --parts chunked $IMP --json $D/now$TAG.json \
    > $D/now$TAG.md 2> $D/now$TAG.log
done

#!/bin/bash
# issue 24 / 28 (session 2026-12-06i, AMX Xeon): bench-edit at the service's defaults (importance scores on, each chunk
# after the stored caches of every chunk before it): the importance mass over every key (before.py: the code before)
# against the mass of the chunk's own keys from the fused kernel's log-sum-exp (now), then one block (now, unchanged
# path); two torch threads, nothing else running, one after the other in one run.
#   bash docs/bench/importance-past-2026-12-06i/run.sh
set -u
unset KVLINK_RAG_CHUNK_CONTEXT KVLINK_RAG_CHUNK_CONTEXT_FROM KVLINK_RAG_CHUNK_LINKS KVLINK_RAG_CHUNK_FRAMES KVLINK_RAG_CHUNK_TOKENS
D=$(dirname "$0")
export KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
PYTHONPATH=. .venv/bin/python $D/before.py bench-edit --nq "$KVLINK_RAG_NQ_PATH" --parts chunked --json $D/before.json \
  > $D/before.md 2> $D/before.log
for PART in chunked block; do
  .venv/bin/kvlink-rag bench-edit --nq "$KVLINK_RAG_NQ_PATH" --parts $PART --json $D/now-$PART.json \
    > $D/now-$PART.md 2> $D/now-$PART.log
done

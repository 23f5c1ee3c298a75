#!/bin/bash
# issue 28 (session 2026-12-06e): bench-edit, chunked part, chunks encoded in context vs alone; one torch thread,
# importance scores off as in BENCHMARKS.md's earlier row.   bash docs/bench/chunk-context-2026-12-06e/run.sh
set -u
D=$(dirname "$0")
export KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
for C in 0 1; do  # KVLINK_RAG_CHUNK_CONTEXT: 0 alone, 1 one chunk back (ran as false/true when it was a bool)
  KVLINK_RAG_CHUNK_CONTEXT=$C .venv/bin/kvlink-rag bench-edit --nq "$KVLINK_RAG_NQ_PATH" --parts chunked --no-importance \
    --json $D/edit-context-$C.json > $D/edit-context-$C.md 2> $D/edit-context-$C.log
done

#!/bin/bash
# issue 28 (session 2026-12-06g, AMX Xeon): bench-edit, chunked part, chunks encoded after the text of one chunk
# (KVLINK_RAG_CHUNK_CONTEXT_FROM=text, the default) against after the stored caches of every chunk before
# (=cache), and the same document as one block; importance scores off as in BENCHMARKS.md's earlier rows; two torch
# threads, nothing else running, one after the other in one run.   bash docs/bench/chunk-cache-2026-12-06g/run.sh
set -u
D=$(dirname "$0")
export KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
for FROM in text cache; do
  KVLINK_RAG_CHUNK_CONTEXT=1 KVLINK_RAG_CHUNK_CONTEXT_FROM=$FROM .venv/bin/kvlink-rag bench-edit --nq "$KVLINK_RAG_NQ_PATH" \
    --parts chunked --no-importance --json $D/edit-$FROM.json > $D/edit-$FROM.md 2> $D/edit-$FROM.log
done
.venv/bin/kvlink-rag bench-edit --nq "$KVLINK_RAG_NQ_PATH" --parts block --no-importance --json $D/edit-block.json \
  > $D/edit-block.md 2> $D/edit-block.log

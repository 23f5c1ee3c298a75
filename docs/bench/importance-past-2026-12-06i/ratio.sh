#!/bin/bash
# What importance scores still cost a chunked long document at the defaults, after both changes of session 2026-12-06i:
# bench-edit --parts chunked with importance off and on, one after the other in one run (AMX Xeon, two threads,
# nothing else running).   bash docs/bench/importance-past-2026-12-06i/ratio.sh
set -u
unset KVLINK_RAG_CHUNK_CONTEXT KVLINK_RAG_CHUNK_CONTEXT_FROM KVLINK_RAG_CHUNK_LINKS KVLINK_RAG_CHUNK_FRAMES KVLINK_RAG_CHUNK_TOKENS
D=$(dirname "$0")
export KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
for IMP in --no-importance --importance; do
  .venv/bin/kvlink-rag bench-edit --nq "$KVLINK_RAG_NQ_PATH" --parts chunked $IMP --json $D/ratio$IMP.json \
    > $D/ratio$IMP.md 2> $D/ratio$IMP.log
done

#!/bin/bash
# bench-edit on the 7,876-token document as one block, importance on and off at this checkout, on the AVX2 EPYC class;
# two threads, nothing else running. Run from the repository root: bash docs/bench/precompute-avx2-2026-12-07c/long.sh
set -u
unset KVLINK_RAG_CHUNK_CONTEXT KVLINK_RAG_CHUNK_CONTEXT_FROM KVLINK_RAG_CHUNK_LINKS KVLINK_RAG_CHUNK_FRAMES KVLINK_RAG_CHUNK_TOKENS
D=$(pwd)/$(dirname "$0")
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
for flag in importance no-importance; do
  .venv/bin/python -c "from cli.main import app; app()" bench-edit --nq "$KVLINK_RAG_NQ_PATH" --parts block --$flag \
    --json "$D/block-$flag.json" > "$D/block-$flag.md" 2> "$D/block-$flag.log"
  echo "block-$flag done: $(date +%T)"
done

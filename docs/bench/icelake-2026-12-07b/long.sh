#!/bin/bash
# bench-edit (the 7,876-token document; PARTS=block: one block, PARTS=chunked: 33 chunks at the service's defaults)
# with importance on at B (ef03e55: the fused kernel's output, the scores formed again for the mass) and at this
# checkout (one explicit softmax), and importance off at this checkout; two threads, nothing else running.
#   B=/tmp/wB PARTS=block bash docs/bench/icelake-2026-12-07b/long.sh
set -u
unset KVLINK_RAG_CHUNK_CONTEXT KVLINK_RAG_CHUNK_CONTEXT_FROM KVLINK_RAG_CHUNK_LINKS KVLINK_RAG_CHUNK_FRAMES KVLINK_RAG_CHUNK_TOKENS
NEW=$(pwd); D=$NEW/$(dirname "$0"); B=${B:-/tmp/wB}; PARTS=${PARTS:-block}
export KVLINK_RAG_NQ_PATH=$(realpath "${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}")
run() {  # name dir importance-flag
  (cd "$2" && "$NEW/.venv/bin/python" -c "from cli.main import app; app()" bench-edit --nq "$KVLINK_RAG_NQ_PATH" \
     --parts "$PARTS" "$3" --json "$D/$1.json" > "$D/$1.md" 2> "$D/$1.log")
  echo "$1 done: $(date +%T)"
}
run "$PARTS-B-imp" "$B" --importance
run "$PARTS-C-imp" "$NEW" --importance
run "$PARTS-C-noimp" "$NEW" --no-importance

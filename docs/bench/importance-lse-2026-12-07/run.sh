#!/bin/bash
# Importance scores from the attention's own log-sum-exp (session 2026-12-07): bench-edit (the 7,876-token document
# in 33 chunks at the service's defaults, PARTS=chunked, or as one block, PARTS=block) with importance on, the code
# before (OLD, a worktree of the commit before) and after (this checkout), and after with importance off, alternating
# ROUNDS times; two threads, nothing else running.
#   OLD=/tmp/old ROUNDS=1 PARTS=chunked bash docs/bench/importance-lse-2026-12-07/run.sh
set -u
unset KVLINK_RAG_CHUNK_CONTEXT KVLINK_RAG_CHUNK_CONTEXT_FROM KVLINK_RAG_CHUNK_LINKS KVLINK_RAG_CHUNK_FRAMES KVLINK_RAG_CHUNK_TOKENS
NEW=$(pwd); D=$NEW/$(dirname "$0"); OLD=${OLD:-/tmp/old}; ROUNDS=${ROUNDS:-1}; PARTS=${PARTS:-chunked}
export KVLINK_RAG_NQ_PATH=$(realpath "${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}")
run() {  # side dir importance-flag
  (cd "$2" && "$NEW/.venv/bin/python" -c "from cli.main import app; app()" bench-edit --nq "$KVLINK_RAG_NQ_PATH" \
     --parts "$PARTS" "$3" --json "$D/$1.json" > "$D/$1.md" 2> "$D/$1.log")
}
for r in $(seq 1 "$ROUNDS"); do
  run "$PARTS-old-imp-$r" "$OLD" --importance
  run "$PARTS-new-imp-$r" "$NEW" --importance
  run "$PARTS-new-noimp-$r" "$NEW" --no-importance
done

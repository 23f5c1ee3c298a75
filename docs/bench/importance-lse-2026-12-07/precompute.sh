#!/bin/bash
# The precompute suite (10 NQ documents, ~4k tokens: encode with importance + store write against transformers'
# raw forward), the code before (OLD worktree) and after (this checkout), alternating ROUNDS times; two threads.
#   OLD=/tmp/old ROUNDS=2 bash docs/bench/importance-lse-2026-12-07/precompute.sh
set -u
NEW=$(pwd); D=$NEW/$(dirname "$0"); OLD=${OLD:-/tmp/old}; ROUNDS=${ROUNDS:-2}
export KVLINK_RAG_NQ_PATH=$(realpath "${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}")
for r in $(seq 1 "$ROUNDS"); do
  for side in old new; do
    dir=$OLD; [ "$side" = new ] && dir=$NEW
    (cd "$dir" && "$NEW/.venv/bin/python" -c "from cli.main import app; app()" bench --suites precompute --lengths 4000 \
       --clients '' --json "$D/precompute-$side-$r.json" > /dev/null 2>&1)
    "$NEW/.venv/bin/python" -c "import json,sys; p=json.load(open(sys.argv[1]))['precompute']; print(sys.argv[2], sys.argv[3], 'tokens', p['tokens'], 'raw %.0f tok/s, precompute %.0f tok/s, ratio %.2f' % (p['raw_tokens_per_s'], p['precompute_tokens_per_s'], p['ratio']))" "$D/precompute-$side-$r.json" "$side" "$r"
  done
done

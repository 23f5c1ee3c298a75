#!/bin/bash
# The precompute suite (10 NQ documents, ~4k tokens: encode with importance + store write against transformers' raw
# forward) at three commits side by side, alternating ROUNDS times; two threads, nothing else running:
#   A = f35979b (auto took q4q8-bf16 on this Ice Lake Xeon), B = ef03e55 (auto reads the CPU flags: q4q8-f32),
#   C = this checkout (importance from one explicit softmax, attend_and_mass).
#   A=/tmp/wA B=/tmp/wB ROUNDS=2 bash docs/bench/icelake-2026-12-07b/precompute.sh
set -u
NEW=$(pwd); D=$NEW/$(dirname "$0"); ROUNDS=${ROUNDS:-2}
export KVLINK_RAG_NQ_PATH=$(realpath "${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}")
for r in $(seq 1 "$ROUNDS"); do
  for side in A B C; do
    dir=${!side:-$NEW}; [ "$side" = C ] && dir=$NEW
    (cd "$dir" && "$NEW/.venv/bin/python" -c "from cli.main import app; app()" bench --suites precompute --lengths 4000 \
       --clients '' --json "$D/precompute-$side-$r.json" > /dev/null 2>&1)
    "$NEW/.venv/bin/python" -c "import json,sys; p=json.load(open(sys.argv[1]))['precompute']; print(sys.argv[2], sys.argv[3], 'tokens', p['tokens'], 'raw %.0f tok/s, precompute %.0f tok/s, ratio %.2f' % (p['raw_tokens_per_s'], p['precompute_tokens_per_s'], p['ratio']))" "$D/precompute-$side-$r.json" "$side" "$r"
  done
done

#!/bin/bash
# The precompute suite on the AVX2 EPYC class (10 NQ documents, ~4k tokens: encode with importance + store write
# against transformers' raw forward), before importance came from one softmax (B = ef03e55, a worktree at /tmp/wB)
# and this checkout (C), alternating ROUNDS times; two threads, nothing else running.
#   ROUNDS=2 bash docs/bench/widen-avx2-2026-12-07c/precompute.sh
set -u
NEW=$(pwd); D=$NEW/$(dirname "$0")/out; ROUNDS=${ROUNDS:-2}; mkdir -p "$D"
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
for r in $(seq 1 "$ROUNDS"); do
  for side in B C; do
    dir=/tmp/wB; [ "$side" = C ] && dir=$NEW
    (cd "$dir" && "$NEW/.venv/bin/python" -c "from cli.main import app; app()" bench --suites precompute --lengths 4000 \
       --clients '' --json "$D/precompute-$side-$r.json" > /dev/null 2>&1)
    "$NEW/.venv/bin/python" -c "import json,sys; p=json.load(open(sys.argv[1]))['precompute']; print(sys.argv[2], sys.argv[3], 'tokens', p['tokens'], 'raw %.0f tok/s, precompute %.0f tok/s, ratio %.2f' % (p['raw_tokens_per_s'], p['precompute_tokens_per_s'], p['ratio']))" "$D/precompute-$side-$r.json" "$side" "$r"
  done
done

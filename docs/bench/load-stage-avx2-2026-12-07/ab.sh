#!/usr/bin/env bash
# Issue 24's load path on an AVX2-only CPU: the streamed load into KV blocks before (the commit named OLD, checked
# out in a worktree) and after (this checkout), alternating, nothing else running, 2 threads.
#   OLD=/tmp/old NEW=/work/main ROUNDS=3 docs/bench/load-stage-avx2-2026-12-07/ab.sh
set -euo pipefail
OLD=${OLD:-/tmp/old}; NEW=${NEW:-$(pwd)}; ROUNDS=${ROUNDS:-3}
OUT=${OUT:-$NEW/docs/bench/load-stage-avx2-2026-12-07}
PY=$NEW/.venv/bin/python
for r in $(seq 1 "$ROUNDS"); do
  for side in old new; do
    dir=$OLD; [ "$side" = new ] && dir=$NEW
    (cd "$dir" && "$PY" -c "from cli.main import app; app()" bench --suites bandwidth --lengths 4000 --repeats 9 \
       --clients '' --json "$OUT/bw-$side-$r.json" > /dev/null 2>&1)
    "$PY" - "$OUT/bw-$side-$r.json" "$side" "$r" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))["bandwidth"]["bfloat16"]["blocks"]
print(f"{sys.argv[2]} {sys.argv[3]}: blocks/floor {b['stream_vs_copy']:.3f} with RoPE {b['stream_rope_vs_copy']:.3f} "
      f"({b['stream_gbps']:.2f} GB/s, floor {b['copy_gbps']:.2f})")
PY
  done
done

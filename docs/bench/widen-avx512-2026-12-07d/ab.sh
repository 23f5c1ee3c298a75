#!/bin/bash
# A/B of the widening row writer's AVX512 build (session 2026-12-07d, AMD EPYC with AVX512-BF16, 2 cores) with
# the KV blocks float32 as on the Ice Lake class (KVLINK_RAG_WEIGHT_FORMAT=q4q8-f32; stored records bfloat16):
# LMDB-warm linked TTFT against the host tier's at ~4k tokens, old (15716f2, before c48286a, a worktree at /tmp/old)
# and new (this checkout) alternating, two rounds, nothing else running.
# Usage (from the repository root): bash docs/bench/widen-avx512-2026-12-07d/ab.sh OUTDIR; summary.txt is
# python docs/bench/widen-avx2-2026-12-07c/summary.py OUTDIR (the AVX2 A/B's summary script)
set -u
O=$(realpath -m $1); mkdir -p $O
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz KVLINK_RAG_WEIGHT_FORMAT=q4q8-f32
for r in 1 2; do
  for side in old new; do
    dir=/work/main; [ $side = old ] && dir=/tmp/old
    (cd $dir && .venv/bin/python -m cli bench --suites ttft --lengths 4000 --clients '' --repeats 7 \
       --json $O/ttft-$side-$r.json) > $O/ttft-$side-$r.log 2>&1
  done
done
echo DONE > $O/done

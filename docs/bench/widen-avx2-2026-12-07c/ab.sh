#!/bin/bash
# A/B of the widening row writer on the AVX2 EPYC class (float32 KV): LMDB-warm linked TTFT against the host tier's at
# ~4k tokens, old (c48286a~1, a worktree at /tmp/old) and new (c48286a) alternating, two rounds, nothing else running.
# Usage (from the repository root): bash docs/bench/widen-avx2-2026-12-07c/ab.sh OUTDIR
set -u
O=$(realpath -m $1); mkdir -p $O
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
for r in 1 2; do
  for side in old new; do
    dir=/work/main; [ $side = old ] && dir=/tmp/old
    (cd $dir && .venv/bin/python -m cli bench --suites ttft --lengths 4000 --clients '' --repeats 7 \
       --json $O/ttft-$side-$r.json) > $O/ttft-$side-$r.log 2>&1
  done
done
echo DONE > $O/done

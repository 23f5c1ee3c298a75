#!/bin/bash
# The load bandwidth suite at this checkout on the AVX2 EPYC class, twice (bfloat16 records into bfloat16 blocks: the
# issue's load target), two threads, nothing else running. Usage: bash docs/bench/widen-avx2-2026-12-07c/bw.sh OUTDIR
set -u
O=$(realpath -m $1); mkdir -p $O
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
for r in 1 2; do
  .venv/bin/python -m cli bench --suites bandwidth --lengths 4000 --clients '' --repeats 9 --json $O/bw-$r.json > $O/bw-$r.log 2>&1
done

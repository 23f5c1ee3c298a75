#!/bin/bash
# Where issue 24's targets stand on an Intel Xeon with Ice Lake's flags (AVX512, no AVX512-BF16, no AMX), 2 cores, at one commit, nothing else
# running: serving 1 / 16 clients with the floor (twice), TTFT and load at 4k (twice), interference, dialogues.
# Usage: state.sh OUTDIR   (run from the repository root)
set -u
O=$1; mkdir -p $O
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
PY=.venv/bin/python
D=docs/bench
for i in 1 2; do
  $PY $D/prefill-kernel-2026-12-05/serving_levels.py $O/serving-$i.jsonl > $O/serving-$i.log 2>&1
  $PY -m cli bench --suites ttft,bandwidth --lengths 4000 --clients '' --repeats 7 --json $O/ttft-$i.json > $O/ttft-$i.log 2>&1
done
$PY -m cli bench-interference --samples 10 --json $O/interf.json > $O/interf.log 2>&1
$PY $D/epyc-state-2026-12-06/dialogues.py $O/dialogues.json > $O/dialogues.log 2>&1
echo DONE > $O/done

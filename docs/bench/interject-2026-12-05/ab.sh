#!/bin/bash
# side by side: old (daa3476, worktree /tmp/old) and new (aab6819, worktree /tmp/new) alternating, nothing else
# running; outputs to /tmp/ab/ then copied here
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
PY=/work/main/.venv/bin/python
S=/work/main/docs/bench/prefill-kernel-2026-12-05/serving_levels.py  # identical copy used in the run
for i in 1 2; do
  for v in old new; do
    (cd /tmp/$v && PYTHONPATH=/tmp/$v $PY $S /tmp/ab/serving-$v-$i.jsonl > /tmp/ab/serving-$v-$i.log 2>&1)
  done
done
for i in 1 2; do
  for v in old new; do
    (cd /tmp/$v && PYTHONPATH=/tmp/$v $PY -m cli bench --suites ttft,bandwidth --lengths 4000 --clients '' --repeats 7 --json /tmp/ab/ttft-$v-$i.json > /tmp/ab/ttft-$v-$i.log 2>&1)
  done
done
echo ABDONE > /tmp/ab/done

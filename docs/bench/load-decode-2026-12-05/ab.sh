#!/bin/bash
# side by side: old (08a6821, worktree /tmp/old) and new (43fa020, worktree /tmp/new) alternating; outputs were
# written to /tmp/ab/ and copied here
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
PY=/work/main/.venv/bin/python
S=/work/main/docs/bench/prefill-kernel-2026-12-05/serving_levels.py
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
for v in old new; do
  (cd /tmp/$v && PYTHONPATH=/tmp/$v $PY -m cli bench-interference --samples 10 --json /tmp/ab/interf-$v.json > /tmp/ab/interf-$v.log 2>&1)
done
echo ABDONE > /tmp/ab/done

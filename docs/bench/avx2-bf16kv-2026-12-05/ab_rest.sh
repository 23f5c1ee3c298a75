#!/bin/bash
# old (c684c03, float32 KV, worktree /tmp/old) vs new (4c96869, bfloat16 KV, worktree /tmp/mid), nothing else
# running: TTFT and load at 4k tokens alternating twice, then the interference bench once each
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
PY=/work/main/.venv/bin/python
for i in 1 2; do
  for v in old mid; do
    (cd /tmp/$v && PYTHONPATH=/tmp/$v $PY -m cli bench --suites ttft,bandwidth --lengths 4000 --clients '' --repeats 5 --json /tmp/ab/ttft-$v-$i.json > /tmp/ab/ttft-$v-$i.log 2>&1)
  done
done
for v in old mid; do
  (cd /tmp/$v && PYTHONPATH=/tmp/$v $PY -m cli bench-interference --samples 10 --json /tmp/ab/interf-$v.json > /tmp/ab/interf-$v.log 2>&1)
done
echo DONE > /tmp/ab/done-rest

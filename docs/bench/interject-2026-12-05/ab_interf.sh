#!/bin/bash
# old (daa3476, worktree /tmp/old) and new (worktree /tmp/new at the commit named in BENCHMARKS) back to back,
# nothing else running; outputs to /tmp/ab/ then copied here
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
PY=/work/main/.venv/bin/python
mkdir -p /tmp/ab
for v in old new; do
  (cd /tmp/$v && PYTHONPATH=/tmp/$v $PY -m cli bench-interference --samples 15 --json /tmp/ab/interf-$v.json > /tmp/ab/interf-$v.log 2>&1)
done
echo DONE > /tmp/ab/interf-done

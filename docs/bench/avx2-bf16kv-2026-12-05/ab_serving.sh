#!/bin/bash
# old (HEAD before the change, worktree /tmp/old) vs new (/work/main working tree), alternating twice
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
PY=/work/main/.venv/bin/python
S=/work/main/docs/bench/prefill-kernel-2026-12-05/serving_levels.py
for i in 1 2; do
  for v in old new; do
    d=/tmp/old; [ $v = new ] && d=/work/main
    (cd $d && PYTHONPATH=$d $PY $S /tmp/ab/sv-$v-$i.jsonl > /tmp/ab/sv-$v-$i.log 2>&1)
  done
done
echo ABDONE > /tmp/ab/done-sv

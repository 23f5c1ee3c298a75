#!/bin/bash
# the interference bench (this commit's bench/prefill_interference.py, with the whole-answer column, copied into
# each worktree) on: old daa3476 (/tmp/old), TTFT interjection only aab6819 (/tmp/new), TTFT + decode interjection
# (/tmp/cur = 365f70d); back to back, nothing else running
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
PY=/work/main/.venv/bin/python
for v in old new cur; do
  (cd /tmp/$v && PYTHONPATH=/tmp/$v $PY -m cli bench-interference --samples 10 --json /tmp/ab/answer-$v.json > /tmp/ab/answer-$v.log 2>&1)
done
echo DONE > /tmp/ab/answer-done

#!/bin/bash
# fc3444c (session start, /tmp/old), f159ba2 (bfloat16 adapter terms + arenas kept, /tmp/mid) and the adapter merged
# into the bfloat16 prefill weights (the working tree), nothing else running: serving levels, then TTFT at 4k tokens,
# each alternating the three codes twice.
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
PY=/work/main/.venv/bin/python
B=/work/main/docs/bench
O=/tmp/ab2; mkdir -p $O
for i in 1 2; do
  for v in old mid new; do
    d=/tmp/$v; [ $v = new ] && d=/work/main
    (cd $d && PYTHONPATH=$d $PY $B/prefill-kernel-2026-12-05/serving_levels.py $O/sv-$v-$i.jsonl > $O/sv-$v-$i.log 2>&1)
  done
done
for i in 1 2; do
  for v in old mid new; do
    d=/tmp/$v; [ $v = new ] && d=/work/main
    (cd $d && PYTHONPATH=$d $PY -m cli bench --suites ttft --lengths 4000 --clients '' --repeats 7 --json $O/ttft-$v-$i.json > $O/ttft-$v-$i.log 2>&1)
  done
done
echo ABDONE > $O/done

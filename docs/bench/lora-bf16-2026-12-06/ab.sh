#!/bin/bash
# old (fc3444c, worktree /tmp/old) against new (the working tree: adapter terms' prefill GEMMs in bfloat16, empty KV
# arenas kept 30 s), nothing else running: serving levels alternating twice, then three 16-client bursts in one
# process each (arenas created / given back per burst), then TTFT at 4k tokens once each.
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
PY=/work/main/.venv/bin/python
B=/work/main/docs/bench
O=/tmp/ab; mkdir -p $O
for i in 1 2; do
  for v in old new; do
    d=/tmp/old; [ $v = new ] && d=/work/main
    (cd $d && PYTHONPATH=$d $PY $B/prefill-kernel-2026-12-05/serving_levels.py $O/sv-$v-$i.jsonl > $O/sv-$v-$i.log 2>&1)
  done
done
for v in old new; do
  d=/tmp/old; [ $v = new ] && d=/work/main
  (cd $d && PYTHONPATH=$d LEVELS=16,16,16 $PY $B/lora-bf16-2026-12-06/arena_churn.py > $O/bursts-$v.log 2>&1)
done
for v in old new; do
  d=/tmp/old; [ $v = new ] && d=/work/main
  (cd $d && PYTHONPATH=$d $PY -m cli bench --suites ttft --lengths 4000 --clients '' --repeats 7 --json $O/ttft-$v.json > $O/ttft-$v.log 2>&1)
done
echo ABDONE > $O/done
# (the new bursts were re-run by hand after arena_churn.py learnt trim(): the first try failed on _give_back)

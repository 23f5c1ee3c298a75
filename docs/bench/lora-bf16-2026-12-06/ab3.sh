#!/bin/bash
# A third look at the serving levels: fc3444c (session start, /tmp/old) against db955ab (merged, the working tree),
# alternating twice, nothing else running.
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
PY=/work/main/.venv/bin/python
B=/work/main/docs/bench
O=/tmp/ab3; mkdir -p $O
for i in 1 2; do
  for v in old new; do
    d=/tmp/old; [ $v = new ] && d=/work/main
    (cd $d && PYTHONPATH=$d $PY $B/prefill-kernel-2026-12-05/serving_levels.py $O/sv-$v-$i.jsonl > $O/sv-$v-$i.log 2>&1)
  done
done
echo ABDONE > $O/done

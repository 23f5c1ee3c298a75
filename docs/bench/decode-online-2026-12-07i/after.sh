#!/bin/bash
# Three more serving runs (1 / 16 clients with the floor) at the code after the one-pass decode attention, nothing
# else running. Usage (repository root): bash docs/bench/decode-online-2026-12-07i/after.sh
set -u
O=$(realpath docs/bench/decode-online-2026-12-07i/after)
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
for r in 1 2 3; do
  .venv/bin/python docs/bench/prefill-kernel-2026-12-05/serving_levels.py $O/serving-$r.jsonl > $O/serving-$r.log 2>&1
done
echo DONE > $O/done

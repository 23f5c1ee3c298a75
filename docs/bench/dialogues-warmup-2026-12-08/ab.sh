#!/bin/bash
# The dialogue bench with and without its warm-up dialogue (old = ab33139 in the worktree /tmp/old, new = this
# checkout), alternating three times, nothing else running; each run is 2026-12-06's dialogues.py (bench defaults).
# Usage (repository root): bash docs/bench/dialogues-warmup-2026-12-08/ab.sh
set -u
O=$(realpath docs/bench/dialogues-warmup-2026-12-08); G=$(realpath docs/bench/epyc-state-2026-12-06/dialogues.py)
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
for r in 1 2 3; do
  (cd /tmp/old && PYTHONPATH=/tmp/old .venv/bin/python $G $O/old-$r.json > $O/old-$r.log 2>&1)
  PYTHONPATH=. .venv/bin/python $G $O/new-$r.json > $O/new-$r.log 2>&1
done
echo DONE > $O/done

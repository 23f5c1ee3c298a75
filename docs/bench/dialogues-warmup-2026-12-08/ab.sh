#!/bin/bash
# The dialogue bench with and without its warm-up dialogue (old = ab33139 in the worktree /tmp/old, new = this
# checkout), alternating three times, nothing else running; each run is 2026-12-06's dialogues.py (bench defaults).
# "new" was the working tree at 2a837b4's bench/dialogues.py (the warm-up, before it evicted its KV from the tree)
# with ab33139's engine (prefill rows on the AVX512-BF16 kernel). after-evict.json: 2026-12-06's dialogues.py once
# more after the warm-up's KV is evicted (the shared variant's peak KV 66.1 MB again, 82.1-82.5 MB in new-*.json).
# Usage (repository root): bash docs/bench/dialogues-warmup-2026-12-08/ab.sh
set -u
O=$(realpath docs/bench/dialogues-warmup-2026-12-08); G=$(realpath docs/bench/epyc-state-2026-12-06/dialogues.py)
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
for r in 1 2 3; do
  (cd /tmp/old && PYTHONPATH=/tmp/old .venv/bin/python $G $O/old-$r.json > $O/old-$r.log 2>&1)
  PYTHONPATH=. .venv/bin/python $G $O/new-$r.json > $O/new-$r.log 2>&1
done
echo DONE > $O/done

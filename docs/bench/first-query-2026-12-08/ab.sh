#!/bin/bash
# The first linked queries of a fresh process, old (753aeb8, worktree /tmp/old: the adapter merged into the prefill
# weights on its first use) against new (this checkout: merged when the engine is built), alternating three times,
# two threads, nothing else running. Usage (repository root): bash docs/bench/first-query-2026-12-08/ab.sh
set -u
O=$(realpath docs/bench/first-query-2026-12-08); S=$O/first_query.py
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
for r in 1 2 3; do
  (cd /tmp/old && PYTHONPATH=/tmp/old .venv/bin/python $S 2>/dev/null | grep -v -i warn > $O/old-$r.txt)
  PYTHONPATH=. .venv/bin/python $S 2>/dev/null | grep -v -i warn > $O/new-$r.txt
done
echo DONE > $O/done

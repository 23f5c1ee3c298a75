#!/bin/bash
# Is this AMX VM's single-client and dialogue figure (1.41-1.67 req/s, 1.95x; 2026-12-05e's AMX VM: 2.15-2.47 req/s,
# 2.06-2.12x) the code or the VM? old = 365f70d (the last commit 2026-12-05e measured, worktree /tmp/old) and new =
# 88e6d03 (worktree /tmp/new; the same code as da152c2, which state.sh ran), alternating twice, nothing else running: serving 1 / 16 clients, then the dialogues.
# Usage (from the repository root): bash docs/bench/amx-state-2026-12-07f/ab.sh
set -u
O=$(realpath docs/bench/amx-state-2026-12-07f/ab); S=$(realpath docs/bench/prefill-kernel-2026-12-05/serving_levels.py)
G=$(realpath docs/bench/epyc-state-2026-12-06/dialogues.py)
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
for r in 1 2; do
  for side in old new; do
    (cd /tmp/$side && PYTHONPATH=/tmp/$side .venv/bin/python $S $O/serving-$side-$r.jsonl > $O/serving-$side-$r.log 2>&1)
    (cd /tmp/$side && PYTHONPATH=/tmp/$side .venv/bin/python $G $O/dialogues-$side-$r.json > $O/dialogues-$side-$r.log 2>&1)
  done
done
echo DONE > $O/done

#!/bin/bash
# Serving (1 and 16 clients with the floor) and 16 five-turn dialogues on the AVX2 EPYC class at this checkout (after
# the widening row writer), one run each, two threads, nothing else running; the TTFT rows of this session are the
# A/B of docs/bench/widen-avx2-2026-12-07c. Usage (from the repository root): bash docs/bench/avx2-state-2026-12-07c/state.sh OUTDIR
set -u
O=$(realpath -m $1); mkdir -p $O
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
PY=.venv/bin/python
D=docs/bench
$PY $D/prefill-kernel-2026-12-05/serving_levels.py $O/serving-1.jsonl > $O/serving-1.log 2>&1
$PY $D/epyc-state-2026-12-06/dialogues.py $O/dialogues.json > $O/dialogues.log 2>&1
echo DONE > $O/done

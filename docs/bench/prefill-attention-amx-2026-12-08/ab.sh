#!/bin/bash
# Serving 1 / 16 clients (serving_levels.py) with prefill rows on the AVX512-BF16 kernel (KVLINK_RAG_PREFILL_ATTENTION=
# kernel, the old default) against the new default on this AMX CPU (auto = SDPA), alternating three times, two
# threads, nothing else running. Usage (repository root): bash docs/bench/prefill-attention-amx-2026-12-08/ab.sh
set -u
O=$(realpath docs/bench/prefill-attention-amx-2026-12-08); S=docs/bench/prefill-kernel-2026-12-05/serving_levels.py
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
for r in 1 2 3; do
  for m in kernel auto; do
    KVLINK_RAG_PREFILL_ATTENTION=$m .venv/bin/python $S $O/serving-$m-$r.jsonl > $O/serving-$m-$r.log 2>&1
  done
done
echo DONE > $O/done

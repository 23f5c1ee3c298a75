#!/bin/bash
# Linked and full-prefill TTFT at 4k (kvlink-rag bench --suites ttft, 3 repeats) and the 16 dialogues (2026-12-06's
# dialogues.py), prefill rows on the AVX512-BF16 kernel (KVLINK_RAG_PREFILL_ATTENTION=kernel) against the default
# here (auto = SDPA on this AMX CPU), alternating twice, two threads, nothing else running.
# Usage (repository root): bash docs/bench/prefill-attention-amx-2026-12-08/ab_ttft.sh
set -u
O=$(realpath docs/bench/prefill-attention-amx-2026-12-08)
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
for r in 1 2; do
  for m in kernel auto; do
    KVLINK_RAG_PREFILL_ATTENTION=$m .venv/bin/python -m cli bench --suites ttft --lengths 4000 --clients '' \
      --repeats 3 --json $O/ttft-$m-$r.json > $O/ttft-$m-$r.log 2>&1
    KVLINK_RAG_PREFILL_ATTENTION=$m .venv/bin/python docs/bench/epyc-state-2026-12-06/dialogues.py \
      $O/dialogues-$m-$r.json > $O/dialogues-$m-$r.log 2>&1
  done
done
echo DONE > $O/done-ttft

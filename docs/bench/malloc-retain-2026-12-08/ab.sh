#!/bin/bash
# Serving 1 / 16 clients (serving_levels.py: the 16-client level is the process's first burst) with glibc's malloc
# at its defaults (KVLINK_RAG_MALLOC_RETAIN=false) against told to keep freed memory (true), alternating three
# times, two threads, nothing else running; then the per-call rotate_into timings of rot_calls.py either way.
# Ran at an uncommitted change (2a837b4 + the setting and not-kept/malloc_tuning.py.txt: mallopt M_MMAP_THRESHOLD
# 32 MiB, M_TRIM_THRESHOLD 1 GiB), not kept: no difference beyond noise. Without it the same comparison is
# MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 in the environment of the "true" runs.
# Usage (repository root): bash docs/bench/malloc-retain-2026-12-08/ab.sh
set -u
O=$(realpath docs/bench/malloc-retain-2026-12-08); S=docs/bench/prefill-kernel-2026-12-05/serving_levels.py
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
for r in 1 2 3; do
  for m in false true; do
    KVLINK_RAG_MALLOC_RETAIN=$m .venv/bin/python $S $O/serving-$m-$r.jsonl > $O/serving-$m-$r.log 2>&1
  done
done
for m in false true; do
  KVLINK_RAG_MALLOC_RETAIN=$m .venv/bin/python docs/bench/amx-phases-2026-12-08/rot_calls.py > $O/rot_calls-$m.txt 2>&1
done
echo DONE > $O/done

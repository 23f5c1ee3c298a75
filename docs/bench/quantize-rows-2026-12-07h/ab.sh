#!/bin/bash
# The Q4 x Q8 activations' rounding vectorised (bedb754) against the scalar loop before it (22d1c90, worktree
# /tmp/old: the engine identical but for it), alternating twice, two threads, nothing else running (AMD EPYC,
# CPU family 26, AVX512-BF16, no AMX; session 2026-12-07h): decode tokens/s of q4q8-bf16 (the auto format here),
# then serving 1 / 16 clients with the floor. Usage (repository root): bash docs/bench/quantize-rows-2026-12-07h/ab.sh
set -u
O=$(realpath docs/bench/quantize-rows-2026-12-07h); S=$(realpath docs/bench/prefill-kernel-2026-12-05/serving_levels.py)
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
for r in 1 2; do
  for side in old new; do
    dir=/tmp/old; [ $side = new ] && dir=/work/main
    (cd $dir && PYTHONPATH=$dir .venv/bin/python -m cli bench-engine --formats q4q8-bf16 --repeats 3 \
      --json $O/engine-$side-$r.json > $O/engine-$side-$r.log 2>&1)
    (cd $dir && PYTHONPATH=$dir .venv/bin/python $S $O/serving-$side-$r.jsonl > $O/serving-$side-$r.log 2>&1)
  done
done
echo DONE > $O/done

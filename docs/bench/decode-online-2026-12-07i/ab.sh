#!/bin/bash
# The one-pass bfloat16 decode attention (1208276) against the two-pass kernel before it (0cc81e7, worktree
# /tmp/old: the engine identical but for it), alternating twice, two threads, nothing else running (AMD EPYC,
# CPU family 25, AVX512-BF16, no AMX; session 2026-12-07i): the kernel alone (attn_micro.py: 16 rows of 1,370
# tokens, 30 layers, distinct and shared KV), decode tokens/s of q4q8-bf16 (the auto format here), then serving
# 1 / 16 clients with the floor. Usage (repository root): bash docs/bench/decode-online-2026-12-07i/ab.sh
set -u
O=$(realpath docs/bench/decode-online-2026-12-07i); S=$(realpath docs/bench/prefill-kernel-2026-12-05/serving_levels.py)
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
for r in 1 2; do
  for side in old new; do
    dir=/tmp/old; [ $side = new ] && dir=/work/main
    (cd $dir && PYTHONPATH=$dir .venv/bin/python $O/attn_micro.py > $O/micro-$side-$r.txt 2>&1)
    (cd $dir && PYTHONPATH=$dir .venv/bin/python -m cli bench-engine --formats q4q8-bf16 --repeats 3 \
      --json $O/engine-$side-$r.json > $O/engine-$side-$r.log 2>&1)
    (cd $dir && PYTHONPATH=$dir .venv/bin/python $S $O/serving-$side-$r.jsonl > $O/serving-$side-$r.log 2>&1)
  done
done
echo DONE > $O/done

#!/bin/bash
# issue 28, session 2026-12-07d (AMD EPYC with AVX512-BF16, 2 cores): the task mixture continued from the SHIPPED
# artifact (its contrast behaviour and the newcomer case are what the 2026-12-06 mixture artifacts lost), then the
# shipping rule on the result, then (if it is worth it) the evaluation lanes. Run from the repository root.
set -u
D=docs/eval/mixture-init-2026-12-07d; A=kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors
export KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-/work/shared/data/nq-open-oracle-dev.jsonl.gz}
# /work/mixhome: a home of its own with the model folder linked in (ln -s ~/.cache/kvlink-rag/models
# /work/mixhome/models), so the pre-encoded documents stay out of the default store; /work/mix4: output, checkpoint
# 1. the recipe, continued from the shipped artifact on other examples (seed 2), fresh optimiser state: nq=1, kv=0.5
#    and long, retention at 0.25 (they gained little in 2026-12-06c), no polarity (it cost the contrast check in
#    2026-12-06d); 150 steps x 8 examples, validation every 50, two threads, nothing else running
KVLINK_RAG_HOME=/work/mixhome MIXTURE=nq=1,kv=0.5,long=0.25,retention=0.25 STEPS=150 VAL_EVERY=50 POOL=64 SEED=2 \
  INIT=$A CKPT=/work/mix4/ckpt KVLINK_RAG_TORCH_THREADS=2 bash scripts/train_mixture_recipe.sh cpu /work/mix4/out
cp /work/mix4/out/mixture.json /work/mix4/out/train.log $D/
# 2. the shipping rule (validation per task, the 96-prompt contrast check, the newcomer case)
mkdir -p $D/ship-check
KVLINK_RAG_HOME=/work/mixhome KVLINK_RAG_TORCH_THREADS=2 .venv/bin/python scripts/ship_check.py \
  /work/mix4/out/mixture.safetensors --out $D/ship-check > $D/ship-check/verdict.json
# 3. the same continuation with the LoRA frozen at the shipped values (--lr 0: only the link embeddings train),
#    and with the LoRA at a third of the recipe's rate (--lr 1e-4); train-links directly with the recipe's settings
A_ARGS="--device cpu --mixture nq=1,kv=0.5,long=0.25,retention=0.25 --seed 2 --init $A --mix-pool 64 --steps 150
  --accumulate 8 --val-every 50 --pack --bf16 --preencode --doc-cache store --time-limit 3000"
for v in "links-only 0 /work/mix5" "lora-1e-4 1e-4 /work/mix6"; do
  set -- $v; mkdir -p $3/out $D/$1/ship-check
  KVLINK_RAG_HOME=/work/mixhome KVLINK_RAG_TORCH_THREADS=2 KVLINK_RAG_COMPUTE_DTYPE=float32 \
    KVLINK_RAG_STORE_MAX_BYTES=$((48 << 30)) .venv/bin/kvlink-rag train-links $A_ARGS --lr $2 \
    --out $3/out/mixture.safetensors --checkpoint $3/ckpt > $3/train.log 2>&1
  cp $3/out/mixture.json $3/out/mixture.png $D/$1/; cp $3/train.log $D/$1/
  KVLINK_RAG_HOME=/work/mixhome KVLINK_RAG_TORCH_THREADS=2 .venv/bin/python scripts/ship_check.py \
    $3/out/mixture.safetensors --out $D/$1/ship-check > $D/$1/ship-check/verdict.json
done
# 4. the per-prompt differences of the three checks (contrast_diff.txt), and the links-only artifact (it passes
#    the rule) against the shipped one on NQ 10 and key-value 10, 100 questions, two lanes; merged tables
.venv/bin/python scripts/contrast_diff.py $D/ship-check $D/lora-1e-4/ship-check $D/links-only/ship-check > $D/contrast_diff.txt  # was $D/contrast_diff.py, moved to scripts/ (2026-12-07e)
cp /work/mix5/out/mixture.safetensors $D/links-only/links-only.safetensors
bash $D/links-only/eval_lanes.sh kv & bash $D/links-only/eval_lanes.sh nq & wait
for t in nq10 kv10; do
  .venv/bin/kvlink-rag eval-report $D/links-only/$t-A.rows.jsonl $D/links-only/$t-L.rows.jsonl \
    --against linked-query-lora@shipped --markdown $D/links-only/$t-merged.md
done
# Note: ship-check/verdict.json (the first variant) was written before e2c1b02, so its "contrast" holds the two
# counts [64, 54] only (the per-prompt scores were overwritten); its rows are ship-check/contrast-*.rows.jsonl.
# The later two verdicts carry the scores as "contrast_scores". paired.txt in links-only/: eval-report --against.

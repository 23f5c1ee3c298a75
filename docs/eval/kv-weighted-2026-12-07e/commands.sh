#!/bin/bash
# issue 28, session 2026-12-07e (AMD EPYC with AVX512-BF16, 2 cores): is the contrast loss of 2026-12-07d's mixture
# (adapter at the recipe's 3e-4: contrast 54 of 96, answers 3.0 words against 4.2) the NQ task's (short NQ-open
# answers) or the key-value task's? The same continuation from the shipped artifact with NQ's weight cut to a
# quarter and key-value's doubled: kv=1, nq=0.25, long and retention 0.25 (seed 3: other examples), adapter at
# the recipe's rate. Then the shipping rule. Run from the repository root.
set -u
D=docs/eval/kv-weighted-2026-12-07e; A=kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors
export KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-/work/shared/data/nq-open-oracle-dev.jsonl.gz}
# /work/mixhome: a home of its own with the model folder linked in, so pre-encoded documents stay out of the
# default store; /work/mix7: output and checkpoint
mkdir -p /work/mixhome && ln -sfn ~/.cache/kvlink-rag/models /work/mixhome/models
KVLINK_RAG_HOME=/work/mixhome MIXTURE=kv=1,nq=0.25,long=0.25,retention=0.25 STEPS=150 VAL_EVERY=50 POOL=64 SEED=3 \
  INIT=$A CKPT=/work/mix7/ckpt KVLINK_RAG_TORCH_THREADS=2 bash scripts/train_mixture_recipe.sh cpu /work/mix7/out
cp /work/mix7/out/mixture.json /work/mix7/out/mixture.png /work/mix7/out/train.log $D/
mkdir -p $D/ship-check
KVLINK_RAG_HOME=/work/mixhome KVLINK_RAG_TORCH_THREADS=2 KVLINK_RAG_STORE_MAX_BYTES=$((48 << 30)) .venv/bin/python scripts/ship_check.py \
  /work/mix7/out/mixture.safetensors --out $D/ship-check > $D/ship-check/verdict.json 2> $D/ship-check/stderr.log
# 2. the finding of 1 (contrast 56 of 96, answers 2.7 words, NQ at a quarter): the kv task's bare-UUID targets teach
#    terse answers. The same continuation with kv targets in a sentence (--mix-kv-answer sentence: "The
#    corresponding value is <uuid>."), 100 steps, validation every 25 (step 50 was 1's best); the shipping rule
#    validates kv on the same sentence targets (--kv-answer sentence) for both artifacts
V=$D/sentence; mkdir -p $V/ship-check /work/mix8/out
KVLINK_RAG_HOME=/work/mixhome KVLINK_RAG_TORCH_THREADS=2 KVLINK_RAG_COMPUTE_DTYPE=float32 \
  KVLINK_RAG_STORE_MAX_BYTES=$((48 << 30)) .venv/bin/kvlink-rag train-links --device cpu \
  --mixture kv=1,nq=0.25,long=0.25,retention=0.25 --mix-kv-answer sentence --seed 3 --init $A --mix-pool 64 \
  --steps 100 --accumulate 8 --val-every 25 --pack --bf16 --preencode --doc-cache store --time-limit 3000 \
  --out /work/mix8/out/mixture.safetensors --checkpoint /work/mix8/ckpt > /work/mix8/train.log 2>&1
cp /work/mix8/out/mixture.json /work/mix8/out/mixture.png /work/mix8/train.log $V/
KVLINK_RAG_HOME=/work/mixhome KVLINK_RAG_TORCH_THREADS=2 KVLINK_RAG_STORE_MAX_BYTES=$((48 << 30)) \
  .venv/bin/python scripts/ship_check.py /work/mix8/out/mixture.safetensors --kv-answer sentence \
  --out $V/ship-check > $V/ship-check/verdict.json 2> $V/ship-check/stderr.log
# 3. 2 (contrast 61 of 96) lost the newcomer case and polarity validation (1.25): the same with polarity=0.5 added
#    (2026-12-06d's polarity task moved the newcomer case right), 50 steps, one thread; beside it, 2's artifact on
#    key-value retrieval over 10 documents (first 100, gold rotated, linked; pairs with 2026-12-07d's shipped rows
#    of the same command on this class, links-only/kv10-A.rows.jsonl)
P=$D/polarity; mkdir -p $P/ship-check /work/mix9/out
KVLINK_RAG_HOME=/work/mixhome KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_COMPUTE_DTYPE=float32 \
  KVLINK_RAG_STORE_MAX_BYTES=$((48 << 30)) .venv/bin/kvlink-rag train-links --device cpu \
  --mixture kv=1,nq=0.25,long=0.25,retention=0.25,polarity=0.5 --mix-kv-answer sentence --seed 3 --init $A \
  --mix-pool 64 --steps 50 --accumulate 8 --val-every 25 --pack --bf16 --preencode --doc-cache store \
  --time-limit 3000 --out /work/mix9/out/mixture.safetensors --checkpoint /work/mix9/ckpt > /work/mix9/train.log 2>&1 &
KVLINK_RAG_TORCH_THREADS=1 .venv/bin/kvlink-rag eval --gold-position rotate --n 100 --modes linked-query-lora \
  --task kv-retrieval --max-new-tokens 100 --docs 10 --adapter /work/mix8/out/mixture.safetensors --tag sentence \
  --json $D/sentence/kv10-S.json > /work/mix8/kv10.log 2>&1
wait
cp /work/mix9/out/mixture.json /work/mix9/out/mixture.png /work/mix9/train.log $P/
KVLINK_RAG_HOME=/work/mixhome KVLINK_RAG_TORCH_THREADS=2 KVLINK_RAG_STORE_MAX_BYTES=$((48 << 30)) \
  .venv/bin/python scripts/ship_check.py /work/mix9/out/mixture.safetensors --kv-answer sentence \
  --out $P/ship-check > $P/ship-check/verdict.json 2> $P/ship-check/stderr.log
# 4. polarity did not bring the newcomer case back (contrast 60, answers 6.5 words): 2's recipe with the adapter at
#    a third of the rate (--lr 1e-4; value targets at 1e-4 lost 2 prompts in 2026-12-07d), 50 steps, two threads
L=$D/lora-1e-4; mkdir -p $L/ship-check /work/mix10/out
KVLINK_RAG_HOME=/work/mixhome KVLINK_RAG_TORCH_THREADS=2 KVLINK_RAG_COMPUTE_DTYPE=float32 \
  KVLINK_RAG_STORE_MAX_BYTES=$((48 << 30)) .venv/bin/kvlink-rag train-links --device cpu \
  --mixture kv=1,nq=0.25,long=0.25,retention=0.25 --mix-kv-answer sentence --seed 3 --init $A --mix-pool 64 \
  --lr 1e-4 --steps 50 --accumulate 8 --val-every 25 --pack --bf16 --preencode --doc-cache store --time-limit 3000 \
  --out /work/mix10/out/mixture.safetensors --checkpoint /work/mix10/ckpt > /work/mix10/train.log 2>&1
cp /work/mix10/out/mixture.json /work/mix10/out/mixture.png /work/mix10/train.log $L/
KVLINK_RAG_HOME=/work/mixhome KVLINK_RAG_TORCH_THREADS=2 KVLINK_RAG_STORE_MAX_BYTES=$((48 << 30)) \
  .venv/bin/python scripts/ship_check.py /work/mix10/out/mixture.safetensors --kv-answer sentence \
  --out $L/ship-check > $L/ship-check/verdict.json 2> $L/ship-check/stderr.log
# 5. 4's artifact on key-value retrieval over 10 documents, as 3's; the paired lines of 2 and 4 against the shipped
#    rows (eval-report --against)
KVLINK_RAG_TORCH_THREADS=1 .venv/bin/kvlink-rag eval --gold-position rotate --n 100 --modes linked-query-lora \
  --task kv-retrieval --max-new-tokens 100 --docs 10 --adapter /work/mix10/out/mixture.safetensors --tag lora-1e-4 \
  --json $D/lora-1e-4/kv10-S.json > /work/mix10/kv10.log 2>&1
for v in sentence lora-1e-4; do
  .venv/bin/kvlink-rag eval-report $D/$v/kv10-S.rows.jsonl docs/eval/mixture-init-2026-12-07d/links-only/kv10-A.rows.jsonl \
    --against linked-query-lora@shipped --markdown $D/$v/kv10-merged.md | tail -3 > $D/$v/paired.txt
done
# 6. 4 failed on polarity validation (1.14) and 4 contrast prompts; 4 with polarity=0.25 added, 50 steps
Q=$D/lora-1e-4-polarity; mkdir -p $Q/ship-check /work/mix11/out
KVLINK_RAG_HOME=/work/mixhome KVLINK_RAG_TORCH_THREADS=2 KVLINK_RAG_COMPUTE_DTYPE=float32 \
  KVLINK_RAG_STORE_MAX_BYTES=$((48 << 30)) .venv/bin/kvlink-rag train-links --device cpu \
  --mixture kv=1,nq=0.25,long=0.25,retention=0.25,polarity=0.25 --mix-kv-answer sentence --seed 3 --init $A \
  --mix-pool 64 --lr 1e-4 --steps 50 --accumulate 8 --val-every 25 --pack --bf16 --preencode --doc-cache store \
  --time-limit 3000 --out /work/mix11/out/mixture.safetensors --checkpoint /work/mix11/ckpt > /work/mix11/train.log 2>&1
cp /work/mix11/out/mixture.json /work/mix11/out/mixture.png /work/mix11/train.log $Q/
KVLINK_RAG_HOME=/work/mixhome KVLINK_RAG_TORCH_THREADS=2 KVLINK_RAG_STORE_MAX_BYTES=$((48 << 30)) \
  .venv/bin/python scripts/ship_check.py /work/mix11/out/mixture.safetensors --kv-answer sentence \
  --out $Q/ship-check > $Q/ship-check/verdict.json 2> $Q/ship-check/stderr.log
# 7. the contrast prompts of every check side by side (contrast_diff.txt)
.venv/bin/python scripts/contrast_diff.py $D/ship-check $D/sentence/ship-check $D/polarity/ship-check \
  $D/lora-1e-4/ship-check $D/lora-1e-4-polarity/ship-check > $D/contrast_diff.txt
# 8. 6's artifact on key-value retrieval over 10 documents, as 5
KVLINK_RAG_TORCH_THREADS=1 .venv/bin/kvlink-rag eval --gold-position rotate --n 100 --modes linked-query-lora \
  --task kv-retrieval --max-new-tokens 100 --docs 10 --adapter /work/mix11/out/mixture.safetensors \
  --tag lora-1e-4-polarity --json $D/lora-1e-4-polarity/kv10-S.json > /work/mix11/kv10.log 2>&1
.venv/bin/kvlink-rag eval-report $D/lora-1e-4-polarity/kv10-S.rows.jsonl \
  docs/eval/mixture-init-2026-12-07d/links-only/kv10-A.rows.jsonl --against linked-query-lora@shipped \
  --markdown $D/lora-1e-4-polarity/kv10-merged.md | tail -3 > $D/lora-1e-4-polarity/paired.txt

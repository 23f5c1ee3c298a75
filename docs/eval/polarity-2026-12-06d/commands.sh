#!/bin/bash
# issue 28, session 2026-12-06d (AVX512-BF16 EPYC, 2 cores): the contrast check, the polarity task and the
# shipping rule. Run from the repository root with KVLINK_RAG_NQ_PATH set.
set -u
D=$(dirname "$0"); KV=${KV:-.venv/bin/kvlink-rag}; A=kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors
C="$KV eval --task contrast --n 16 --docs 2 --gold-position first,last"
export KVLINK_RAG_TORCH_THREADS=${KVLINK_RAG_TORCH_THREADS:-1}
mkdir -p $D/ship-check $D/ship-check-previous $D/checkpoints
# /work/mix3 (the run's output and checkpoint) and /work/shiphome (a home with the model folder linked in:
# ln -s ~/.cache/kvlink-rag/models /work/shiphome/models) were this machine's; any folders do
# 1. the contrast check with the shipped artifact (and full prefill, naive, full prefill with its adapter)
$C --modes full,naive,full-adapted,linked-query-lora --adapter $A --tag shipped --json $D/contrast-shipped.json
# 2. the same with the 2026-12-06 mixture artifact
$C --modes full-adapted,linked-query-lora --adapter docs/eval/mixture-2026-12-06/mixture.safetensors \
  --tag mixture --json $D/contrast-mixture-2026-12-06.json
# 3. the shipping rule on the 2026-12-06 mixture artifact (a home of its own: the model folder linked in)
KVLINK_RAG_HOME=/work/shiphome .venv/bin/python scripts/ship_check.py docs/eval/mixture-2026-12-06/mixture.safetensors \
  --out $D/ship-check-previous > $D/ship-check-previous/verdict.json
# 4. the recipe with the polarity task, continued from the 2026-12-06 mixture artifact on other examples (seed 1)
MIXTURE=nq=1,kv=0.5,long=0.5,retention=0.5,polarity=0.5 STEPS=400 VAL_EVERY=50 POOL=256 TIME_LIMIT=2700 SEED=1 \
  INIT=docs/eval/mixture-2026-12-06/mixture.safetensors \
  CKPT=/work/mix3/ckpt KVLINK_RAG_TORCH_THREADS=2 bash scripts/train_mixture_recipe.sh cpu /work/mix3/out
# 5. the shipping rule on its artifact (best validation step 350 of 400 by the in-run rule)
cp /work/mix3/out/mixture.safetensors $D/polarity.safetensors
KVLINK_RAG_HOME=/work/shiphome .venv/bin/python scripts/ship_check.py $D/polarity.safetensors --out $D/ship-check \
  > $D/ship-check/verdict.json
# 6. insight only (not a shipping candidate): the contrast check on the run's other saved steps (150: best nq,
#    350: best polarity = the artifact, 400: last)
for t in best-nq best-polarity last; do
  $C --modes linked-query-lora --adapter /work/mix3/out/mixture-$t.safetensors --tag $t --json $D/checkpoints/${t#best-}.json
done
# 7. the evaluation lanes of the artifact (nq10 kv10)
bash $D/eval_lanes.sh nq10 kv10 nq20 ret04 long   # two lanes at a time here

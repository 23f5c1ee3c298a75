#!/bin/bash
# issue 28, session 2026-12-07f (Intel Xeon with AMX, 2 cores): 2026-12-07e's run 4 (sentence kv targets, adapter
# 1e-4, 50 steps from the shipped artifact) met the key-value target (kv 10: 0.300 against the shipped 0.090) and
# kept the newcomer case, but missed the shipping rule by polarity validation 1.14 (allowed 1.10) and 4 contrast
# prompts (60 against 64). WiSE-FT (weight-space interpolation, training/wise_ft.py) between the shipped artifact
# and run 4 trades part of the kv gain for the shipped behaviour with no training: interpolate, then the shipping
# rule (scripts/ship_check.py), then key-value retrieval over 10 documents. Run from the repository root.
set -u
D=docs/eval/wise-ft-2026-12-07f; A=kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors
R4=docs/eval/kv-weighted-2026-12-07e/lora-1e-4/lora-1e-4.safetensors
# TUNED: run 4 by default; run 6 (run 4 + polarity 0.25: validation passed, contrast 63, newcomer case lost) with
# TUNED=docs/eval/kv-weighted-2026-12-07e/lora-1e-4-polarity/lora-1e-4-polarity.safetensors TAG=r6-
# PARTS: other weights for parts of the adapter, e.g. PARTS="--part self_attn=1" TAG=attn1-
TUNED=${TUNED:-$R4}; TAG=${TAG:-}; PARTS=${PARTS:-}
export KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-/work/shared/data/nq-open-oracle-dev.jsonl.gz}
H=/work/wisehome; mkdir -p $H /work/wise && ln -sfn ~/.cache/kvlink-rag/models $H/models
W=${W:-0.5}; N=${TAG}w$W; V=$D/$N; mkdir -p $V/ship-check
.venv/bin/python scripts/interpolate_links.py $A $TUNED --weight $W $PARTS --out /work/wise/$N.safetensors
KVLINK_RAG_HOME=$H KVLINK_RAG_TORCH_THREADS=2 .venv/bin/python scripts/ship_check.py /work/wise/$N.safetensors \
  --kv-answer sentence --out $V/ship-check > $V/ship-check/verdict.json 2> $V/ship-check/stderr.log
KVLINK_RAG_TORCH_THREADS=2 .venv/bin/kvlink-rag eval --gold-position rotate --n 100 --modes linked-query-lora \
  --task kv-retrieval --max-new-tokens 100 --docs 10 --adapter /work/wise/$N.safetensors --tag $N \
  --json $V/kv10-W.json > $V/kv10.log 2>&1

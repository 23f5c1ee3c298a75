#!/bin/bash
# issue 28, session 2026-12-07f: the interpolations found the kv gain in the answer's form (sentence answers right
# 17-29%, others 1-15%) and carried by the adapter's MLP change, which costs the contrast check. Can the link tokens
# alone teach the form? 2026-12-07e's run 2 recipe (kv=1, nq/long/retention 0.25, sentence kv targets, seed 3, from
# the shipped artifact) with the adapter frozen (--lr 0: link embeddings only, at their 1e-3), 50 steps; then the
# rule and kv over 10 documents. Run from the repository root.
set -u
D=docs/eval/wise-ft-2026-12-07f/links-sentence; A=kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors
export KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-/work/shared/data/nq-open-oracle-dev.jsonl.gz}
H=/work/wisehome; mkdir -p $H /work/ls/out $D/ship-check && ln -sfn ~/.cache/kvlink-rag/models $H/models
KVLINK_RAG_HOME=$H KVLINK_RAG_TORCH_THREADS=2 KVLINK_RAG_COMPUTE_DTYPE=float32 KVLINK_RAG_STORE_MAX_BYTES=$((48 << 30)) \
  .venv/bin/kvlink-rag train-links --device cpu --mixture kv=1,nq=0.25,long=0.25,retention=0.25 \
  --mix-kv-answer sentence --seed 3 --init $A --mix-pool 64 --lr 0 --steps 50 --accumulate 8 --val-every 25 --pack \
  --bf16 --preencode --doc-cache store --time-limit 1200 --out /work/ls/out/mixture.safetensors \
  --checkpoint /work/ls/ckpt > /work/ls/train.log 2>&1
cp /work/ls/out/mixture.json /work/ls/out/mixture.png /work/ls/train.log $D/
KVLINK_RAG_HOME=$H KVLINK_RAG_TORCH_THREADS=2 KVLINK_RAG_STORE_MAX_BYTES=$((48 << 30)) .venv/bin/python \
  scripts/ship_check.py /work/ls/out/mixture.safetensors --kv-answer sentence --out $D/ship-check \
  > $D/ship-check/verdict.json 2> $D/ship-check/stderr.log
KVLINK_RAG_TORCH_THREADS=2 .venv/bin/kvlink-rag eval --gold-position rotate --n 100 --modes linked-query-lora \
  --task kv-retrieval --max-new-tokens 100 --docs 10 --adapter /work/ls/out/mixture.safetensors --tag links-sentence \
  --json $D/kv10-W.json > $D/kv10.log 2>&1

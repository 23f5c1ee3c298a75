#!/bin/bash
# issue 28 (session 2026-12-07d, AVX512-BF16 EPYC): the links-only continuation (L) against the shipped artifact (A),
# linked, on the same machine and questions (first 100 dev questions, gold rotated; kv from eval's seed 0); one torch
# thread a lane, two lanes:  bash eval_lanes.sh kv &  bash eval_lanes.sh nq &   (rows resume)
set -u
export KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-/work/shared/data/nq-open-oracle-dev.jsonl.gz}
D=$(dirname "$0"); A=kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors; L=$D/links-only.safetensors
E="${KV:-.venv/bin/kvlink-rag} eval --gold-position rotate --n ${N:-100} --modes linked-query-lora"
for side in L A; do
  ART=$L; TAG=links-only; [ $side = A ] && ART=$A && TAG=shipped
  case $1 in
    kv) $E --task kv-retrieval --max-new-tokens 100 --docs 10 --adapter $ART --tag $TAG --json $D/kv10-$side.json ;;
    nq) $E --doc-cache store --task nq --docs 10 --adapter $ART --tag $TAG --json $D/nq10-$side.json ;;
  esac
done

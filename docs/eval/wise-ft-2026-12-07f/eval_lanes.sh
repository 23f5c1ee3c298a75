#!/bin/bash
# issue 28 item 5 (session 2026-12-07f, Intel Xeon with AMX): candidate C against the shipped artifact A, paired on
# the same machine and questions (first dev questions, gold rotated; kv from eval's seed 0, disjoint from training's);
# one torch thread a lane, two lanes:  C=... bash eval_lanes.sh nq &  C=... bash eval_lanes.sh other &
set -u
export KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-/work/shared/data/nq-open-oracle-dev.jsonl.gz}
D=$(dirname "$0")/item5; mkdir -p $D; A=kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors
E=".venv/bin/kvlink-rag eval --gold-position rotate"; L=linked-query-lora
for side in C A; do
  ART=$C; TAG=candidate; FULL=""; [ $side = A ] && ART=$A && TAG=shipped && FULL=full,
  case $1 in
    nq) $E --doc-cache store --n 300 --task nq --docs 10 --modes $FULL$L --adapter $ART --tag $TAG --json $D/nq10-$side.json
        $E --doc-cache store --n 100 --task nq --docs 20 --modes $FULL$L --adapter $ART --tag $TAG --json $D/nq20-$side.json ;;
    other)
        $E --n 100 --task kv-retrieval --max-new-tokens 100 --docs 20 --modes $FULL$L --adapter $ART --tag $TAG --json $D/kv20-$side.json
        $E --n 100 --task nq --docs 10 --modes $L --retention 0.4 --adapter $ART --tag $TAG --json $D/ret04-$side.json
        $E --n 100 --task nq --docs 10 --modes $L --retention 0.6 --adapter $ART --tag $TAG --json $D/ret06-$side.json
        $E --doc-cache store --n 100 --task long-docs --docs 20 --chunk-tokens 0,512 --modes $L --adapter $ART --tag $TAG --json $D/long-$side.json ;;
  esac
done

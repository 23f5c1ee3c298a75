#!/bin/bash
# issue 28 item 5 (session 2026-12-06d, AVX512-BF16 EPYC): the polarity-trained artifact (P) on the evaluation
# tasks, as docs/eval/mixture-2026-12-06/commands.sh ran the shipped (A) and 2026-12-06 mixture (M) artifacts;
# one torch thread a lane.   bash eval_lanes.sh TASK...   (nq10 kv10 nq20 long ret04; rows resume)
set -u
TASKS=${*:-nq10 kv10}; N=${N:-100}
export KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
P=${P:-docs/eval/polarity-2026-12-06d/polarity.safetensors}
D=$(dirname "$0")
E="${KV:-.venv/bin/kvlink-rag} eval --gold-position rotate"; S="--doc-cache store"; L=linked-query-lora
run() { echo "== $(date +%T) $*"; "$@" || echo "!! rc=$?"; }
for T in $TASKS; do
  J="--adapter $P --tag polarity --json $D/$T-P.json"
  case $T in
    nq10) run $E $S --n $N --task nq --docs 10 --modes full-adapted,$L $J ;;
    kv10) run $E --n $N --task kv-retrieval --max-new-tokens 100 --docs 10 --modes $L $J ;;
    nq20) run $E $S --n $N --task nq --docs 20 --modes $L $J ;;
    long) run $E $S --n $N --task long-docs --docs 20 --chunk-tokens 0,512 --modes $L $J ;;
    ret04) run $E --n $N --task nq --docs 10 --modes $L --retention 0.4 $J ;;
    *) echo "unknown task $T" >&2; exit 2 ;;
  esac
done

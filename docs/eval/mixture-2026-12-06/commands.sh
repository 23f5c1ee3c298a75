#!/bin/bash
# issue 28 item 5 (session 2026-12-06c, AMX Xeon): the shipped artifact (A) vs the mixture artifact trained this
# session by scripts/train_mixture_recipe.sh cpu (M), paired on the same questions; lanes of one torch thread.
#   bash commands.sh A [TASK...]   # full prefill + linked with the shipped artifact
#   bash commands.sh M [TASK...]   # full prefill with the mixture adapter (nq10) + linked with the mixture artifact
# TASK: nq10 kv10 ret04 ret06 long nq20 kv20 (default: all). Rows: <task>-<lane>.rows.jsonl here (a rerun
# resumes); merged by kvlink-rag eval-report ... --against.
set -u
LANE=$1; shift; TASKS=${*:-nq10 kv10 ret04 ret06 long nq20 kv20}; N=${N:-100}
export KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
A=${A:-kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors}
M=${M:-/work/mixture-run2/out/mixture.safetensors}
D=$(dirname "$0")
E="${KV:-.venv/bin/kvlink-rag} eval --gold-position rotate"; S="--doc-cache store"; L=linked-query-lora
if [ "$LANE" = A ]; then ART=$A; TAG=shipped; FULL=full; REF=full,; else ART=$M; TAG=mixture; FULL=full-adapted; REF=; fi
run() { echo "== $(date +%T) $*"; "$@" || echo "!! rc=$?"; }
for T in $TASKS; do
  J="--adapter $ART --tag $TAG --json $D/$T-$LANE.json"
  case $T in
    nq10) run $E $S --n $N --task nq --docs 10 --modes $FULL,$L $J ;;
    kv10) run $E --n $N --task kv-retrieval --max-new-tokens 100 --docs 10 --modes $REF$L $J ;;
    ret04) run $E --n $N --task nq --docs 10 --modes $L --retention 0.4 $J ;;
    ret06) run $E --n $N --task nq --docs 10 --modes $L --retention 0.6 $J ;;
    long) run $E $S --n $N --task long-docs --docs 20 --chunk-tokens 0,512 --modes $REF$L $J ;;
    nq20) run $E $S --n $N --task nq --docs 20 --modes $REF$L $J ;;
    kv20) run $E --n $N --task kv-retrieval --max-new-tokens 100 --docs 20 --modes $REF$L $J ;;
    *) echo "unknown task $T" >&2; exit 2 ;;
  esac
done

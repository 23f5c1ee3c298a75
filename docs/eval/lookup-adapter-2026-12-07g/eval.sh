#!/bin/bash
# issue 28, session 2026-12-07g (AMD EPYC, AVX2 only, 2 cores): the bundled `lookup` adapter
# (kvlink_rag/assets/adapters/lookup.safetensors = 2026-12-06c's task-mixture artifact, docs/eval/mixture-2026-12-06/;
# chosen over 2026-12-07e's run 4 by key-value retrieval over 10 documents on questions 0-99: 0.58 against 0.30) on
# questions it was not picked on, paired with full prefill of the untuned model and the shipped (default) artifact on
# the same questions. Two lanes, one torch thread each (full prefill of 10 documents takes ~20 s a question on one
# thread here, so the session's CPU gave 50 questions a lane at 10 documents and 25 at 20); run from the repository root:
#   bash docs/eval/lookup-adapter-2026-12-07g/eval.sh 100 150 100 125 &  bash docs/eval/lookup-adapter-2026-12-07g/eval.sh 200 250 150 175 &
# (a rerun resumes each rows file)
set -u
export KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-/work/shared/data/nq-open-oracle-dev.jsonl.gz}
D=$(dirname "$0"); S=$1; N=$2; K=$3; KN=$4
A=kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors
E=".venv/bin/kvlink-rag eval --gold-position rotate --task kv-retrieval --max-new-tokens 100"
$E --docs 10 --start $S --n $N --modes full,linked-query-lora --adapter lookup --tag lookup --json $D/kv10-lookup-$S.json > $D/kv10-lookup-$S.log 2>&1
$E --docs 10 --start $S --n $N --modes linked-query-lora --adapter $A --tag shipped --json $D/kv10-shipped-$S.json > $D/kv10-shipped-$S.log 2>&1
$E --docs 20 --start $K --n $KN --modes full,linked-query-lora --adapter lookup --tag lookup --json $D/kv20-lookup-$K.json > $D/kv20-lookup-$K.log 2>&1
$E --docs 20 --start $K --n $KN --modes linked-query-lora --adapter $A --tag shipped --json $D/kv20-shipped-$K.json > $D/kv20-shipped-$K.log 2>&1
echo done > $D/lane-$S.done

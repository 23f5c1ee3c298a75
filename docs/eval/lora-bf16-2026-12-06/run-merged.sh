#!/bin/bash
# As run.sh, for the adapter merged into the bfloat16 prefill weights (the working tree after the merge commit):
# the shipped adapter's linked answers, first 300 dev questions, two one-thread processes.
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz KVLINK_RAG_TORCH_THREADS=1
O=/tmp/evallora; mkdir -p $O
A=kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors
E="/work/main/.venv/bin/python -m cli eval --gold-position rotate --modes linked-query-lora --adapter $A --tag lora-merged"
cd /work/main
$E --n 150 --start 0 --json $O/lora-merged-0.json > $O/merged-0.log 2>&1 &
$E --n 300 --start 150 --json $O/lora-merged-150.json > $O/merged-150.log 2>&1 &
wait
echo EVALDONE > $O/done-merged

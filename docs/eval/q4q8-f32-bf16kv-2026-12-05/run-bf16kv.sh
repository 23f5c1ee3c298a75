#!/bin/bash
# q4q8-f32 with bfloat16 KV (this session's change), first 300 dev questions in two one-thread processes
cd /work/main
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_WEIGHT_FORMAT=q4q8-f32
A=kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors
E=".venv/bin/kvlink-rag eval --gold-position rotate --modes full,linked-query-lora --adapter $A --tag q4q8w"
$E --n 150 --start 0 --json /tmp/evalw/q4q8-f32-bf16kv-0.json > /tmp/evalw/e0.log 2>&1 &
$E --n 300 --start 150 --json /tmp/evalw/q4q8-f32-bf16kv-150.json > /tmp/evalw/e150.log 2>&1 &
wait
echo EVALDONE > /tmp/evalw/done

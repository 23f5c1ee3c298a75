#!/bin/bash
# q4q8-f32 as it was before this session (float32 KV; commit c684c03 in /tmp/old), the same 300 questions, two one-thread processes
cd /tmp/old
export PYTHONPATH=/tmp/old KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_WEIGHT_FORMAT=q4q8-f32
A=kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors
E="/work/main/.venv/bin/python -m cli eval --gold-position rotate --modes full,linked-query-lora --adapter $A --tag q4q8f32"
$E --n 150 --start 0 --json /tmp/evalo/q4q8-f32-f32kv-0.json > /tmp/evalo/e0.log 2>&1 &
$E --n 300 --start 150 --json /tmp/evalo/q4q8-f32-f32kv-150.json > /tmp/evalo/e150.log 2>&1 &
wait
echo EVALDONE > /tmp/evalo/done

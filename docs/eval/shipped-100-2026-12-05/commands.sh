#!/bin/bash
# issue 28 item 5: the shipped artifact vs full prefill extended to 100 questions, and retention 0.6 (one thread)
export KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_NQ_PATH=../shared/data/nq-open-oracle-dev.jsonl.gz
A=kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors
E="kvlink-rag eval --gold-position rotate"; S="--doc-cache store"
$E --n 100 --start 50 --task kv-retrieval --max-new-tokens 100 --docs 20 --modes full,linked-query-lora --adapter $A --tag shipped --json kv20-a-50.json
$E --n 100 --task nq --docs 10 --modes linked-query-lora --retention 0.6 --adapter $A --tag shipped --json ret06-a.json
$E $S --n 100 --start 50 --task nq --docs 20 --modes full,linked-query-lora --adapter $A --tag shipped --json nq20-a-50.json
$E $S --n 100 --start 30 --task long-docs --docs 20 --chunk-tokens 0,512 --modes full,linked-query-lora --adapter $A --tag shipped --json long-a-30.json
# merged with docs/eval/mixture-2026-12-05/{kv20,nq20,long,ret,nq10}-a.rows.jsonl by kvlink-rag eval-report ... --against

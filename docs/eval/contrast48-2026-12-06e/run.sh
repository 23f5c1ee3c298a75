#!/bin/bash
# issue 28 (session 2026-12-06e, AVX512-BF16 EPYC, one torch thread): the contrast check's 48 cases (96 prompts,
# both orders), linked with the shipped artifact and the two candidates of 2026-12-06 / 2026-12-06d, and full
# prefill (untuned, and with the shipped adapter) for reference.   bash docs/eval/contrast48-2026-12-06e/run.sh
set -u
D=$(dirname "$0")
export KVLINK_RAG_TORCH_THREADS=1 KVLINK_RAG_NQ_PATH=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
C=".venv/bin/kvlink-rag eval --task contrast --n 48 --docs 2 --gold-position first,last"
A=kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors
$C --modes full,full-adapted,linked-query-lora --adapter $A --tag shipped --json $D/contrast-shipped.json
$C --modes linked-query-lora --adapter docs/eval/polarity-2026-12-06d/polarity.safetensors --tag polarity \
  --json $D/contrast-polarity.json
$C --modes linked-query-lora --adapter docs/eval/mixture-2026-12-06/mixture.safetensors --tag mixture \
  --json $D/contrast-mixture.json

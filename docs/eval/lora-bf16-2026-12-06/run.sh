#!/bin/bash
# The shipped adapter's linked answers on the first 300 dev questions (10 documents, rotate), q4q8-bf16 (auto on the
# AVX512-BF16 EPYC): the adapter terms' prefill GEMMs in bfloat16 (the working tree, /work/main) against float32 (the
# commit before, worktree /tmp/old), each in two one-thread processes; old and new one after the other.
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz KVLINK_RAG_TORCH_THREADS=1
O=/tmp/evallora; mkdir -p $O
A=kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors
for v in new old; do
  d=/work/main; [ $v = old ] && d=/tmp/old
  E="/work/main/.venv/bin/python -m cli eval --gold-position rotate --modes linked-query-lora --adapter $A --tag lora-$v"
  (cd $d && PYTHONPATH=$d $E --n 150 --start 0 --json $O/lora-$v-0.json > $O/$v-0.log 2>&1) &
  (cd $d && PYTHONPATH=$d $E --n 300 --start 150 --json $O/lora-$v-150.json > $O/$v-150.log 2>&1) &
  wait
done
echo EVALDONE > $O/done

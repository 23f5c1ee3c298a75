#!/bin/bash
# Pilot (session 2026-12-06i, AMX Xeon, one thread a lane, two lanes: bash lanes.sh 1 & bash lanes.sh 2): retention 0.4 with
# KVzip-style reconstruction scores (reconstruct_pilot.py patches the eval) against the H2O importance, dev
# questions 300-379 (held out from every evaluation, which use the first 300). rmax-h2o was stopped at 26 questions.
cd "$(dirname "$0")/../../.."
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz KVLINK_RAG_TORCH_THREADS=1
A=kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors
E="eval --gold-position rotate --start 300 --n 380 --task nq --docs 10 --modes linked-query-lora --adapter $A"
run() { PILOT_SCORE=$1 PILOT_ORDER=$2 .venv/bin/python docs/eval/retention-reconstruct-2026-12-06i/reconstruct_pilot.py $E --retention $3 --tag $1-$2 --json docs/eval/retention-reconstruct-2026-12-06i/$1-$2.json > docs/eval/retention-reconstruct-2026-12-06i/$1-$2.log 2>&1; }
if [ "$1" = 1 ]; then run h2o h2o 0.4,1.0; run rsum top 0.4; else run rmax top 0.4; run rmax h2o 0.4; fi

#!/bin/bash
# The merged tables of this folder from the rows (run from the repository root): merged.txt / merged.json, every
# layout against this machine's one block; merged-epyc.txt against 2026-12-06e's one block and 2026-12-06f's layouts
# (the AVX512 EPYC's rows: pairs across machines).
set -u
D=$(dirname "$0"); E=docs/eval/chunk-context-2026-12-06e; F=docs/eval/chunk-links-2026-12-06f; R=${KV:-.venv/bin/kvlink-rag}
HERE="$D/long-cache-0.rows.jsonl $D/long-cache-150.rows.jsonl $D/long-block-0.rows.jsonl $D/long-block-150.rows.jsonl \
  $D/long-text-0.rows.jsonl $D/long-text-150.rows.jsonl"
EPYC="$E/long-ctx.rows.jsonl $E/long-ctx-100.rows.jsonl $E/long-ctx-200.rows.jsonl $F/long-bare-last-0.rows.jsonl \
  $F/long-bare-last-150.rows.jsonl"
export COLUMNS=200
$R eval-report $HERE --against "linked-query-lora one-block@amx" --json $D/merged.json > $D/merged.txt
$R eval-report $D/long-cache-0.rows.jsonl $D/long-cache-150.rows.jsonl $EPYC --against "linked-query-lora one-block@ctx" \
  > $D/merged-epyc.txt
$R eval-report $HERE --against "linked-query-lora chunks=512@text" > $D/merged-vs-text.txt

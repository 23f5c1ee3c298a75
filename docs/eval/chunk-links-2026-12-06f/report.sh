#!/bin/bash
# The merged tables of this folder from the rows (run from the repository root): merged.txt / merged.json against one
# block, merged-vs-each.txt against the default layout (both over the four 300-question layouts), merged-window.txt
# the same with the whole-document window's 71 questions added (paired on the questions both have).
set -u
D=$(dirname "$0"); O=docs/eval/chunk-context-2026-12-06e; R=${KV:-.venv/bin/kvlink-rag}
BASE="$O/long-ctx.rows.jsonl $O/long-ctx-100.rows.jsonl $O/long-ctx-200.rows.jsonl $D/long-last-0.rows.jsonl \
  $D/long-last-150.rows.jsonl $D/long-bare-last-0.rows.jsonl $D/long-bare-last-150.rows.jsonl"
W64="$D/long-bare-last-w64-0.rows.jsonl $D/long-bare-last-w64-75.rows.jsonl"
export COLUMNS=200
$R eval-report $BASE --against "linked-query-lora one-block@ctx" --json $D/merged.json > $D/merged.txt
$R eval-report $BASE --against "linked-query-lora chunks=512@ctx" > $D/merged-vs-each.txt
{ $R eval-report $BASE $W64 --against "linked-query-lora one-block@ctx"
  $R eval-report $BASE $W64 --against "linked-query-lora chunks=512@ctx" | grep " - "; } > $D/merged-window.txt

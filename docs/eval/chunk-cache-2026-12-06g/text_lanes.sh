#!/bin/bash
# issue 28 (session 2026-12-06g, AMX Xeon): the default chunk encoding (each chunk after the text of the one chunk
# before it, KVLINK_RAG_CHUNK_CONTEXT_FROM=text) in eval_lanes.sh's layout, same 300 questions and machine.
#   bash docs/eval/chunk-cache-2026-12-06g/text_lanes.sh
FROM=text exec bash "$(dirname "$0")/eval_lanes.sh"

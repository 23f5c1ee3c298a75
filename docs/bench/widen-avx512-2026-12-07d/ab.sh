#!/bin/bash
# A/B of the widening row writer's AVX512 build (session 2026-12-07d, AMD EPYC with AVX512-BF16, 2 cores) with
# the KV blocks float32 as on the Ice Lake class (KVLINK_RAG_WEIGHT_FORMAT=q4q8-f32; stored records bfloat16):
# LMDB-warm linked TTFT against the host tier's at ~4k tokens, old (15716f2, before c48286a, a worktree at /tmp/old)
# and new (this checkout) alternating, two rounds, nothing else running.
# Usage (from the repository root): bash docs/bench/widen-avx512-2026-12-07d/ab.sh OUTDIR; summary.txt is
# python docs/bench/widen-avx2-2026-12-07c/summary.py OUTDIR (the AVX2 A/B's summary script)
# The AVX2 A/B's script with the weight format exported (same bench, worktree and alternation).
KVLINK_RAG_WEIGHT_FORMAT=q4q8-f32 exec bash "$(dirname "$0")/../widen-avx2-2026-12-07c/ab.sh" "$@"

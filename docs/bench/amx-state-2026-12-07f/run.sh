#!/bin/bash
# Where issue 24's targets stand on an Intel Xeon with AMX (2 cores) at one commit, nothing else running:
# 2026-12-06's state script (serving 1 / 16 clients with the floor twice, TTFT and load at 4k twice, interference,
# dialogues). Run from the repository root:  bash docs/bench/amx-state-2026-12-07f/run.sh
set -u
O=docs/bench/amx-state-2026-12-07f; git rev-parse --short HEAD > $O/commit
bash docs/bench/epyc-state-2026-12-06/state.sh $O

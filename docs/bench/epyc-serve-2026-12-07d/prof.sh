#!/bin/bash
# One serving run (1 and 16 clients, the floor) with py-spy sampling the 16-client level (100 Hz, 25 s, raw stacks
# per thread). Usage (repository root): bash docs/bench/epyc-serve-2026-12-07d/prof.sh OUTDIR
set -u
O=$(realpath -m $1); mkdir -p $O; rm -f $O/marker
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
D=docs/bench/epyc-serve-2026-12-07d
# run1/ was taken with serve_prof.py, a copy of serving_levels.py plus the marker (its frames in spy.txt name it);
# serving_levels.py now takes the marker itself
.venv/bin/python docs/bench/prefill-kernel-2026-12-05/serving_levels.py $O/serving.jsonl $O/marker > $O/serving.log 2>&1 &
while [ ! -f $O/marker ]; do sleep 0.5; done
.venv/bin/py-spy record --pid $(cat $O/marker) --rate 100 --duration 25 --format raw --threads -o $O/spy.txt > $O/spy.log 2>&1
wait
echo DONE > $O/done

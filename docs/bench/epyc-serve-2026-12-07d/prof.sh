#!/bin/bash
# One serving run (1 and 16 clients, the floor) with py-spy sampling the 16-client level (100 Hz, 25 s, raw stacks
# per thread). Usage (repository root): bash docs/bench/epyc-serve-2026-12-07d/prof.sh OUTDIR
set -u
O=$(realpath -m $1); mkdir -p $O; rm -f $O/marker
export KVLINK_RAG_NQ_PATH=/work/shared/data/nq-open-oracle-dev.jsonl.gz
D=docs/bench/epyc-serve-2026-12-07d
.venv/bin/python $D/serve_prof.py $O/serving.jsonl $O/marker > $O/serving.log 2>&1 &
while [ ! -f $O/marker ]; do sleep 0.5; done
.venv/bin/py-spy record --pid $(cat $O/marker) --rate 100 --duration 25 --format raw --threads -o $O/spy.txt > $O/spy.log 2>&1
wait
echo DONE > $O/done

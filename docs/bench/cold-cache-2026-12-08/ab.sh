#!/bin/bash
# Linked TTFT of `make demo` (5 NQ questions, 10 cached documents each, its LMDB store already filled) with the page
# cache dropped before each run (a reboot's or memory pressure's state), LMDB's readahead off (the old setting,
# MDB_NORDAHEAD) against on, alternating twice. Run in a clone of the repository (it edits store/lmdb_env.py there;
# as root: it writes /proc/sys/vm/drop_caches). Usage: bash docs/bench/cold-cache-2026-12-08/ab.sh CLONE
set -u
cd $1
for r in 1 2; do
  for ra in False True; do
    sed -i "s/readahead=[A-Za-z]*, lock=True/readahead=$ra, lock=True/" store/lmdb_env.py
    sync; echo 3 > /proc/sys/vm/drop_caches
    echo "readahead=$ra run $r: $(make demo NQ=/work/shared/data/nq-open-oracle-dev.jsonl.gz 2>&1 | grep -E 'linked  ' | grep -o 'TTFT *[0-9]* ms' | tr '\n' ' ')"
  done
done
git checkout store/lmdb_env.py

import json,sys,glob
from collections import defaultdict
base = {}
for f in sorted(glob.glob('docs/eval/retention-reconstruct-2026-12-06i/*.rows.jsonl')):
    d=defaultdict(dict)
    for l in open(f):
        r=json.loads(l); d[r['mode']][r['index']]=r
    for m,v in d.items():
        em=[x['em'] for x in v.values()]; nll=[x['nll'] for x in v.values()]
        print(f"{m:50s} n={len(v):3d} acc={sum(em)/len(em):.3f} nll={sum(nll)/len(nll):.3f}")
print()
for f in sorted(glob.glob('docs/eval/retention-reconstruct-2026-12-06i/*.rows.jsonl')):
    d=defaultdict(lambda: defaultdict(list))
    for l in open(f):
        r=json.loads(l); d[r['mode']][r['gold_position']].append(r['em'])
    for m,v in d.items():
        print(f"{m:50s}", {k: f"{sum(x)/len(x):.3f}/{len(x)}" for k,x in v.items()})

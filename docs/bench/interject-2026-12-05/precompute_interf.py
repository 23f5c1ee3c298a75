"""A short cached query's latency while ~4k-token documents are precomputed (bench/interference.py), JSON argv[1]."""
import json, os, sys
from bench.interference import precompute_interference
from cli.common import make_engine, make_settings
from evaluation.nq import load_nq
eng = make_engine(make_settings())
res = precompute_interference(eng, load_nq(os.environ["KVLINK_RAG_NQ_PATH"]), samples=int(sys.argv[2]), log=print)
print(json.dumps({k: v for k, v in res.items() if not isinstance(v, list)}))
json.dump(res, open(sys.argv[1], "w"), indent=1)

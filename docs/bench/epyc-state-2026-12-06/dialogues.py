"""16 five-turn dialogues with and without prefix sharing (bench/dialogues.py defaults), JSON to argv[1]."""
import json, os, sys
from bench.dialogues import dialogues
from cli.common import make_engine, make_settings
from evaluation.nq import load_nq
eng = make_engine(make_settings())
res = dialogues(eng, load_nq(os.environ["KVLINK_RAG_NQ_PATH"]), log=print)
s, u = res["shared"], res["unshared"]
res["ratio"] = s["turns_per_s"] / u["turns_per_s"]
print(json.dumps({k: res[k] for k in ("ratio",)}), s["turns_per_s"], u["turns_per_s"])
json.dump(res, open(sys.argv[1], "w"), indent=1)

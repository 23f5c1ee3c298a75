"""Does serving documents from the cold tier (retention 0.4, int8) change NQ answers? (issue 15)

The first ``--n`` NQ dev questions, ``--docs`` documents each (gold passage rotated first/middle/last), the
default model with the shipped link tokens and query-side adapter, greedy, 24 new tokens. Every document is
precomputed into a throw-away store (bfloat16, importance order) and into a cold tier; each question is then
answered at retention ``--retention`` twice: with the documents read from the store (a bfloat16 prefix read:
what EVALUATION.md's retention table measures) and served from the cold tier (int8). Reports both accuracies,
how many answers are identical, and the largest first-token logit difference::

    python -m bench.tier_accuracy [--n 30] [--docs 10] [--retention 0.4] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch

from evaluation.nq import best_subspan_em, build_documents, load_nq
from kvlink_rag.engine import Engine
from kvlink_rag.linking.link_tokens import load_link_tokens
from kvlink_rag.model.loader import load_model
from service.settings import get_settings
from store.doc_cache import StoreCache
from store.factory import open_store
from store.tiers.tier import CacheTier
from store.tiers.tiered import TieredCache

ADAPTER = Path(__file__).resolve().parents[1] / "kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors"
POSITIONS = ("first", "middle", "last")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--docs", type=int, default=10)
    ap.add_argument("--retention", type=float, default=0.4)
    ap.add_argument("--nq", default=None, help="NQ jsonl(.gz); default KVLINK_RAG_NQ_PATH")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    nq = a.nq or os.environ.get("KVLINK_RAG_NQ_PATH")
    if not nq:
        ap.error("give --nq or set KVLINK_RAG_NQ_PATH (the NQ jsonl(.gz) file)")
    examples = load_nq(nq)
    base = get_settings()
    lm = load_model(base)
    home = Path(tempfile.mkdtemp(prefix="kvlink-tier-acc-"))
    settings = base.model_copy(update={"home": home, "host_cache_bytes": 0, "cold_cache_bytes": 2 << 30,
                                       "cold_cache_retention": a.retention, "cold_cache_int8": True})
    st = open_store(settings)
    engine = Engine(settings, lm=lm, cache=st.cache)
    engine = engine.with_link_tokens(load_link_tokens(ADAPTER, lm))
    store_only = StoreCache(TieredCache([CacheTier("none", 0)], st.blobs))  # same keys, no memory tier
    cold = st.tiered.tiers[-1]
    rows = []
    for i in range(a.n):
        ex = examples[i]
        docs, _ = build_documents(examples, i, a.docs, POSITIONS[i % 3])
        for d in docs:
            key = engine.cache_key(d)
            if not st.blobs.contains(key):
                st.cache.write(key, engine.encode(d))  # store (bf16, importance order) and cold tier
        row = {"index": i}
        for name, cache in (("store", store_only), ("cold", st.cache)):
            engine.cache = cache
            ctx, hits = engine.link_context(ex.question, docs, retention=a.retention)
            ans = engine.finish(ctx, engine.sampling(max_new_tokens=24), 0.0, hits)
            row[name] = {"answer": ans.text, "em": best_subspan_em(ans.text, ex.answers),
                         "logits": ctx.last_logits.float().cpu()}
        row["logit_diff"] = float((row["store"]["logits"] - row["cold"]["logits"]).abs().max())
        for name in ("store", "cold"):
            del row[name]["logits"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        out = summary(rows, a.docs, a.retention)
        out["cold_tier"] = {k: cold.stats()[k] for k in ("hits", "partial_misses", "entries", "used_bytes")}
        if a.json:  # after every question, so a run cut short keeps what it measured
            Path(a.json).write_text(json.dumps({"summary": out, "rows": rows}, indent=1))
    print(json.dumps(out))
    return out


def summary(rows: list[dict], docs: int, retention: float) -> dict:
    """Accuracy from the store and from the cold tier, identical answers, largest first-token logit difference."""
    return {"n": len(rows), "docs": docs, "retention": retention,
            "accuracy_store": sum(r["store"]["em"] for r in rows) / len(rows),
            "accuracy_cold": sum(r["cold"]["em"] for r in rows) / len(rows),
            "identical_answers": sum(r["store"]["answer"] == r["cold"]["answer"] for r in rows),
            "max_first_logit_diff": max(r["logit_diff"] for r in rows)}


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()

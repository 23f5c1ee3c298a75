"""On real NQ queries and the real model: batched, prefix-shared serving equals one request at a time
(logits within 1e-4 in float32, identical greedy tokens, last-layer KV cosine 1)."""

from __future__ import annotations

import pytest

from factories import NQ_PATH, real_engine
from evaluation.nq import build_documents, load_nq
from service.verify import verify


def test_batched_and_shared_nq_queries_match_single_requests(tmp_path):
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    engine = real_engine(tmp_path, kv_dtype="float32")
    examples = load_nq(NQ_PATH, limit=200)
    cases = [(examples[i].question, build_documents(examples, i, 10)[0]) for i in range(2)]
    rows = verify(engine, cases, max_new_tokens=6)
    for r in rows:
        assert r.max_abs_logit_diff < 1e-4 and r.greedy_agree
        assert r.key_cosine > 0.999999 and r.value_cosine > 0.999999
        assert r.tree_tokens > 1000  # the second pass took the whole prompt but its last token from the tree

"""The embedded default with the real default model over real NQ passages."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api_helpers import service_settings
from factories import NQ_PATH, real_engine
from evaluation.nq import best_subspan_em, build_documents, load_nq

pytestmark = pytest.mark.e2e


def test_real_model_answers_nq_and_the_second_query_is_served_from_the_cache(tmp_path):
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    examples = load_nq(NQ_PATH, limit=200)
    ex = examples[1]
    docs, gold = build_documents(examples, 1, 3, "first")
    engine = real_engine(tmp_path / "engine", max_new_tokens=12)
    app = create_app(service_settings(tmp_path / "home", precompute_threads=0), engine)
    with TestClient(app) as c:
        batch = [{"id": f"p{i}", "title": d.title or "", "text": d.text} for i, d in enumerate(docs)]
        assert c.post("/v1/documents", json={"documents": batch}).status_code == 202
        ask = {"question": ex.question, "document_ids": [d["id"] for d in batch]}

        first = c.post("/v1/query", json=ask).json()
        assert [d["cache_hit"] for d in first["documents"]] == [False, False, False]  # encoded on the spot
        second = c.post("/v1/query", json=ask).json()
        assert [d["cache_hit"] for d in second["documents"]] == [True, True, True]
        assert second["answer"] == first["answer"] and second["answer"].strip()
        assert second["timings"]["cache_load_s"] < first["timings"]["cache_load_s"]
        assert second["timings"]["ttft_s"] < first["timings"]["ttft_s"]
        assert best_subspan_em(second["answer"], ex.answers) in (0.0, 1.0)

        by_search = c.post("/v1/query", json={"question": ex.question, "top_k": 2}).json()
        assert f"p{gold}" in [d["id"] for d in by_search["documents"]]  # BM25 finds the gold passage
        assert all(d["cache_hit"] for d in by_search["documents"])

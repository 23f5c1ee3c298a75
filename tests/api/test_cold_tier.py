"""The cold tier through the service: filled by a query's retained read, serving later queries at that
retention, a partial miss for r=1, and its entries and partial misses in /metrics."""

from __future__ import annotations

import time

from api_helpers import wait_ready
from test_health import _sample


def test_cold_tier_serves_low_retention_queries_and_counts_partial_misses(make_client, fixture_docs):
    with make_client(host_cache_bytes=0, cold_cache_bytes=64 << 20) as c:
        c.post("/v1/documents", json=fixture_docs[1])
        wait_ready(c, "paris")
        cold = c.app_state.store.tiered.tiers[-1]
        assert cold.name == "cold" and len(cold) == 0  # precompute writes the store only
        ask = {"question": "capital of France?", "document_ids": ["paris"], "retention": 0.4}
        first = c.post("/v1/query", json=ask)
        assert first.status_code == 200
        for _ in range(100):  # the prefix read hands its part to the cold tier after its last layer
            if len(cold):
                break
            time.sleep(0.02)
        assert cold.stats()["entries_by_retention"] == {"0.4": 1}
        second = c.post("/v1/query", json=ask)
        assert second.status_code == 200 and cold.stats()["hits"] == 1
        assert c.post("/v1/query", json={**ask, "retention": 1.0}).status_code == 200
        text = c.get("/metrics").text
    assert _sample(text, "kvlink_cache_partial_misses_total", tier="cold") == cold.stats()["partial_misses"] >= 1
    assert _sample(text, "kvlink_cache_entries", tier="cold", retention="0.4") == 1
    assert _sample(text, "kvlink_cache_used_bytes", tier="cold") == cold.stats()["used_bytes"] > 0

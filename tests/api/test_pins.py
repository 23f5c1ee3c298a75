"""Pinning: PUT /v1/documents/{id} with pinned keeps a document's cache in the host tier whatever else is read,
within the tenant's pin budget (409 with the numbers past it); /metrics shows the pinned bytes; listed pins
apply at start."""

from __future__ import annotations

from api_helpers import wait_ready
from store.tiers.tier_fill import TIER_FILLER


def _host(client):
    return next(t for t in client.app_state.store.tiered.tiers if t.name == "host")


def test_a_pinned_cache_stays_in_the_host_tier_within_the_budget(make_client, fixture_docs):
    with make_client() as probe:  # how large is one document in the host tier?
        probe.post("/v1/documents", json={"documents": fixture_docs})
        for d in fixture_docs:
            wait_ready(probe, d["id"])
        pinned = probe.put("/v1/documents/lighthouse", json={"pinned": True})
        assert pinned.status_code == 200, pinned.text
        size = pinned.json()["nbytes"]
    with make_client(host_cache_bytes=int(size * 2.5), pin_budget_bytes=int(size * 1.5)) as c:
        r = c.put("/v1/documents/lighthouse", json={"pinned": True})
        assert r.status_code == 200 and r.json()["pinned"] and r.json()["nbytes"] > 0
        key = c.get("/v1/documents/lighthouse").json()["cache_key"]
        over = c.put("/v1/documents/paris", json={"pinned": True})
        assert over.status_code == 409 and over.json()["error"]["code"] == "pin_budget_exceeded"
        assert f"pins {r.json()['nbytes']} of its {int(size * 1.5)}-byte budget" in over.json()["error"]["message"]
        for d in fixture_docs[1:]:  # more than the host tier holds beside the pinned one
            assert c.post("/v1/query", json={"question": "q", "document_ids": [d["id"]]}).status_code == 200
            TIER_FILLER.join()  # a document streamed from LMDB enters the host tier after the answer, off its path
        assert key in _host(c) and _host(c).counters["evictions"] > 0
        assert f'kvlink_pinned_bytes{{tenant="default"}} {float(r.json()["nbytes"])}' in c.get("/metrics").text
        off = c.put("/v1/documents/lighthouse", json={"pinned": False})
        assert off.status_code == 200 and off.json()["tenant_pinned_bytes"] == 0
        assert c.put("/v1/documents/paris", json={"pinned": True}).status_code == 200
        assert c.put("/v1/documents/paris", json={}).status_code == 422
        assert c.put("/v1/documents/nope", json={"pinned": True}).status_code == 404
        assert c.delete("/v1/documents/paris").status_code == 200
        assert c.app_state.runtime.pins.bytes_by_tenant() == {}
    with make_client(pinned_documents=["volcano", "default/photosynthesis"]) as again:  # same home: listed pins
        pins = again.app_state.runtime.pins
        assert pins.is_pinned("default", "volcano") and pins.is_pinned("default", "photosynthesis")

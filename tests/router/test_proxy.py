"""The router in front of two replicas (in-process uvicorn servers on loopback, one Redis DB): a query goes to
the replica holding its documents, top_k is resolved and passed on, streams pass through, bad input gets the
replica's own 4xx, a listed replica that is down costs a retry, not a failure."""

from __future__ import annotations

import json

import httpx

from router_support import fleet_of
from service_support import wait_for


def _ready(client, doc_id):
    return wait_for(lambda: client.get(f"/v1/documents/{doc_id}").json().get("status") == "ready", 60,
                    what=f"{doc_id} ready")


def test_queries_go_to_the_replica_holding_their_documents(make_replica, make_router, documents):
    with make_replica("a") as a, make_replica("b") as b, make_router() as router:
        ca, cb, cr = httpx.Client(base_url=a.url), httpx.Client(base_url=b.url), httpx.Client(base_url=router.url)
        assert ca.post("/v1/documents", json={"documents": documents}).status_code == 202
        for d in documents:
            _ready(ca, d["id"])  # a precomputed them all: its local LMDB holds them
        assert cb.post("/v1/query", json={"question": "lava?", "document_ids": ["volcano"]}).status_code == 200
        fleet_of(cr, 2)
        held = lambda: {r["id"]: r["documents"] for r in cr.get("/router/status").json()["replicas"]}  # noqa: E731
        wait_for(lambda: held().get("a", 0) >= 4 and held().get("b", 0) >= 1, 10, what="both replicas' events")

        r = cr.post("/v1/query", json={"question": "Who kept the lamp?", "document_ids": ["lighthouse", "paris"]})
        assert r.status_code == 200 and r.headers["x-kvlink-replica"] == "a"
        assert [d["cache_hit"] for d in r.json()["documents"]] == [True, True]
        # volcano is in b's host tier and in a's LMDB (and a's host tier too when its precompute's events say so,
        # which depends on timing): either holder may win, never a replica without it
        r = cr.post("/v1/query", json={"question": "lava?", "document_ids": ["volcano"]})
        assert r.status_code == 200 and r.headers["x-kvlink-replica"] in ("a", "b")
        r = cr.post("/v1/query", json={"question": "Mount Erebus lava lake", "top_k": 1})  # resolved by the router
        assert r.status_code == 200 and [d["id"] for d in r.json()["documents"]] == ["volcano"]

        chat = {"messages": [{"role": "user", "content": "Tell me about lava"}], "document_ids": ["volcano"],
                "stream": True, "max_tokens": 3}
        with cr.stream("POST", "/v1/chat/completions", json=chat) as s:
            assert s.status_code == 200 and s.headers["x-kvlink-replica"] in ("a", "b")
            first = s.headers["x-kvlink-replica"]
            events = [line for line in s.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and json.loads(events[0][6:])["object"] == "chat.completion.chunk"
        again = {**chat, "stream": False, "document_ids": ["lighthouse"],
                 "messages": chat["messages"] + [{"role": "assistant", "content": "x"},
                                                 {"role": "user", "content": "More?"}]}
        assert cr.post("/v1/chat/completions", json=again).headers["x-kvlink-replica"] == first  # sticks

        for bad in ({"question": "", "document_ids": ["lighthouse"]}, {"question": "q", "document_ids": ["nope"]},
                    {"question": "q", "top_k": 0}):
            direct, routed = ca.post("/v1/query", json=bad), cr.post("/v1/query", json=bad)
            assert routed.status_code == direct.status_code and 400 <= direct.status_code < 500
            assert routed.json() == direct.json()
        direct = ca.post("/v1/query", content=b"{not json", headers={"content-type": "application/json"})
        routed = cr.post("/v1/query", content=b"{not json", headers={"content-type": "application/json"})
        assert (routed.status_code, routed.json()) == (direct.status_code, direct.json())
        assert cr.get("/v1/documents/paris").json()["id"] == "paris"  # other routes: any live replica


def test_a_listed_replica_that_is_down_costs_a_retry_and_no_failure(make_replica, make_router, documents):
    dead = "http://127.0.0.1:9"  # discard port: connection refused
    with make_replica("a") as a, make_router(replicas=[dead, a.url], events_url="", policy="round-robin") as router:
        cr = httpx.Client(base_url=router.url)
        cr.post("/v1/documents", json=documents[0])
        _ready(cr, documents[0]["id"])
        for _ in range(3):
            r = cr.post("/v1/query", json={"question": "q", "document_ids": [documents[0]["id"]]})
            assert r.status_code == 200 and r.headers["x-kvlink-replica"] == a.url


def _leave_after(url: str, body: dict, after_s: float) -> None:
    try:
        with httpx.Client(timeout=httpx.Timeout(after_s, connect=5.0)) as client:
            with client.stream("POST", f"{url}/v1/query", json=body) as r:
                for _ in r.iter_bytes():
                    pass
    except httpx.TimeoutException:
        return
    raise AssertionError("answered although the model was busy")


def test_a_client_that_leaves_the_router_cancels_its_request_on_the_replica(make_replica, make_router):
    import threading

    with make_replica("a", precompute_threads=0) as a, make_router(replicas=[a.url], events_url="") as router:
        state = a.app.state.service
        httpx.post(f"{router.url}/v1/documents", json={"id": "d", "text": "Harbour 3 had 5 cranes."}, timeout=30)
        with state.model_lock:  # the replica's model is busy: the routed queries wait there
            bodies = [{"question": "How many cranes?", "document_ids": ["d"], "stream": i % 2 == 0} for i in range(4)]
            clients = [threading.Thread(target=_leave_after, args=(router.url, b, 0.3)) for b in bodies]
            for t in clients:
                t.start()
            for t in clients:
                t.join(30)
            wait_for(lambda: state.gates.model.borrowed_tokens == 0, 10, interval=0.02,
                     what="the replica released the slots of the queries whose clients left the router")
        r = httpx.post(f"{router.url}/v1/query", json={"question": "q", "document_ids": ["d"]}, timeout=60)
        assert r.status_code == 200

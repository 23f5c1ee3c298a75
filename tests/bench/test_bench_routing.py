"""The routing benchmark's query mix (the suite itself runs replica processes: `kvlink-rag bench --suites routing`)."""

from collections import Counter

from bench.routing_workload import zipf_queries


def test_queries_draw_distinct_documents_zipf_skewed_and_repeatably():
    qs = zipf_queries(40, 400, 3, seed=1)
    assert qs == zipf_queries(40, 400, 3, seed=1) and all(len(set(q)) == 3 for q in qs)
    counts = Counter(d for q in qs for d in q)
    assert counts[0] > counts[10] > counts[39]


def test_the_overhead_measure_sends_the_same_requests_both_ways_and_reports_medians():
    import httpx

    from bench.routing import _overhead

    seen = Counter()

    def handler(request: httpx.Request) -> httpx.Response:
        seen[(request.url.host, request.method, request.url.path)] += 1
        return httpx.Response(200, json={})

    res = _overhead("http://router", "http://replica", 5, "who?", httpx.Client(transport=httpx.MockTransport(handler)))
    assert set(res) == {"healthz", "query"}
    for host in ("router", "replica"):  # 5 measured + 2 warm-ups per kind
        assert seen[(host, "GET", "/healthz")] == seen[(host, "POST", "/v1/query")] == 7
    for row in res.values():
        assert row["requests"] == 5 and row["direct_p50_s"] > 0 and row["routed_p50_s"] > 0


def _fleet_transport(state: dict):
    """A fake router: answers from replica ``a`` or ``b`` alternately; a request for passage d13 or d14 waits
    for the kill (``state['killed']``, an Event), then d14 gets a 502 and d13 fails mid-stream from ``b``."""
    import threading

    import httpx

    lock = threading.Lock()

    def handler(request: httpx.Request) -> httpx.Response:
        body = request.read().decode()
        with lock:
            state["n"] = state.get("n", 0) + 1
            replica = "ab"[state["n"] % 2]
        if '"d13"' in body or '"d14"' in body:
            assert state["killed"].wait(10)
        if '"d14"' in body:
            return httpx.Response(502, json={"error": {"code": "replica_failed"}})
        if '"d13"' in body:
            return httpx.Response(200, headers={"x-kvlink-replica": "b"}, content=b"event: token\ndata: {}\n\n")
        return httpx.Response(200, headers={"x-kvlink-replica": replica},
                              content=b"event: token\ndata: {}\n\nevent: done\ndata: {}\n\n")

    return httpx.MockTransport(handler)


def test_the_clients_send_every_query_once_and_call_the_kill_halfway():
    from bench.routing_clients import run_clients, summarize

    import threading

    state: dict = {"killed": threading.Event()}
    queries = [[i, i + 1] for i in range(15)]  # d13 in queries 12 and 13, d14 in 13 and 14
    sent, wall, killed_at = run_clients("http://router", queries, ["q?"], 3, call_at=6,
                                        call=state["killed"].set, transport=_fleet_transport(state))
    assert len(sent) == 15 and state["n"] == 15 and killed_at > 0 and wall > 0
    assert all(s.ok and s.ttft_s is not None and s.replica in "ab" for s in sent[:12])
    assert [s.ok for s in sent[12:]] == [False] * 3 and sent[12].replica == "b" and "HTTP 502" in sent[13].error
    row = summarize(sent, wall)
    assert row["requests"] == 15 and row["failed"] == 3 and sum(row["requests_per_replica"].values()) == 12


def test_a_kill_counts_failures_in_flight_on_the_killed_replica_apart_from_any_other():
    from bench.routing_clients import Sent, kill_outcome

    sent = [Sent(start=0.0, end=2.0, replica="b", ok=False, error="RemoteProtocolError"),  # in flight on b
            Sent(start=0.5, end=3.0, replica="a", ok=True),
            Sent(start=0.2, end=0.9, replica="b", ok=True),  # ended before the kill
            Sent(start=1.5, end=2.5, replica=None, ok=False, error="HTTP 502"),  # after: no replica answered
            Sent(start=1.6, end=2.6, replica="c", ok=True)]
    out = kill_outcome(sent, "b", 1.0)
    assert out["in_flight_on_killed_at_kill"] == 1 and out["failed_in_flight_on_killed"] == 1
    assert out["failed_other"] == 1 and out["failed_other_without_replica"] == 1
    assert out["sent_after_kill"] == 2 and out["answered_by_killed_after_kill"] == 0
    assert out["errors"] == ["HTTP 502", "RemoteProtocolError"]


def test_the_command_line_takes_the_issue_setup_and_overrides():
    from bench.routing import ISSUE_SETUP, _arguments

    a = _arguments(["nq.jsonl.gz", "models", "policies,kill", "--issue", "--queries", "500"])
    assert a.issue and a.queries == 500 and a.replicas is None and a.parts == "policies,kill"
    assert ISSUE_SETUP == {"replicas": 4, "n_docs": 1000, "docs_per_query": 10, "clients": 16}


def test_replica_names_run_a_to_z_then_numbered():
    from bench.routing_fleet import replica_names

    assert replica_names(4) == ["a", "b", "c", "d"] and replica_names(27)[-1] == "r26"

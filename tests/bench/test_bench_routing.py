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

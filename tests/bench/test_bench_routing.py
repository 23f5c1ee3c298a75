"""The routing benchmark's query mix (the suite itself runs replica processes: `kvlink-rag bench --suites routing`)."""

from collections import Counter

from bench.routing import _queries


def test_queries_draw_distinct_documents_zipf_skewed_and_repeatably():
    qs = _queries(40, 400, 3, seed=1)
    assert qs == _queries(40, 400, 3, seed=1) and all(len(set(q)) == 3 for q in qs)
    counts = Counter(d for q in qs for d in q)
    assert counts[0] > counts[10] > counts[39]

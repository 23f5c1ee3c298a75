"""Admission policies order waiting requests from what they see of each (documents, bucket, wait)."""

from __future__ import annotations

import pytest

from kvlink_rag.decoding.generate import SamplingParams
from kvlink_rag.runtime.admission import BucketPolicy, CacheAwarePolicy, WaitingView
from kvlink_rag.runtime.gen_request import GenRequest
from kvlink_rag.runtime.policies import make_policy
from kvlink_rag.types import Document

A, B, C = (Document(f"text {x}", x) for x in "ABC")


def waiting(docs, bucket="short", starved=False) -> WaitingView:
    req = GenRequest(lambda: None, list(docs), [1, 2], SamplingParams())
    return WaitingView(req, 10, bucket, 5.0 if starved else 0.1, starved)


def running(docs) -> GenRequest:
    return GenRequest(lambda: None, list(docs), [1], SamplingParams())


def test_buckets_put_the_starved_first_then_the_oldest_requests_bucket():
    ws = [waiting([A], "short"), waiting([B], "long"), waiting([C], "long", starved=True), waiting([A], "short")]
    assert BucketPolicy().order(ws, []) == [2, 0, 3, 1]


def test_cache_aware_prefers_documents_the_running_requests_hold_then_arrival():
    ws = [waiting([A]), waiting([B, C]), waiting([C]), waiting([A], starved=True)]
    # starved first; then B+C (shares C with the running request), then C (now warm twice), then A
    assert CacheAwarePolicy().order(ws, [running([C])]) == [3, 1, 2, 0]
    assert CacheAwarePolicy().order(ws[:3], []) == [0, 1, 2]  # nothing warm: arrival order, grouped by overlap


def test_an_unknown_policy_is_refused_by_name():
    assert isinstance(make_policy("cache-aware"), CacheAwarePolicy)
    with pytest.raises(ValueError, match="unknown admission policy 'lifo'"):
        make_policy("lifo")

"""QueryService over a runtime: answer and stream run the engine's one decode loop and agree with the
engine's own answer; closing a stream early releases the model."""

from __future__ import annotations

import time

import pytest

from kvlink_rag.decoding.answer import run_to_end
from service.errors import ServiceError

PARIS = "Paris is the capital and largest city of France."
QUESTION = "What is the capital of France?"


@pytest.fixture
def runtime(make_runtime):
    rt = make_runtime()
    rt.documents.ingest("default", "paris", PARIS, "Paris")
    return rt


def test_answer_stream_and_the_engine_give_the_same_tokens(runtime, tiny_engine):
    queries = runtime.queries
    whole = queries.answer(queries.plan("default", QUESTION, ["paris"]))
    events = list(queries.stream(queries.plan("default", QUESTION, ["paris"])))
    kinds = [kind for kind, _ in events]
    assert kinds[-1] == "done" and set(kinds[:-1]) <= {"token"} and len(kinds) > 1
    streamed = events[-1][1]
    pieces = "".join(value for kind, value in events if kind == "token")
    assert streamed.token_ids == whole.token_ids and len(whole.token_ids) == 4
    assert pieces.strip() == streamed.answer == whole.answer
    assert (streamed.finish_reason, streamed.context_tokens) == (whole.finish_reason, whole.context_tokens)
    assert set(whole.timings) == {"retrieval_s", "queue_wait_s", "cache_load_s", "link_s", "ttft_s", "total_s"}
    doc = queries.plan("default", QUESTION, ["paris"]).docs[0].document
    direct = tiny_engine.answer(QUESTION, [doc])
    assert direct.token_ids == whole.token_ids and direct.text == whole.answer
    assert direct.context_tokens == whole.context_tokens and direct.finish_reason == whole.finish_reason
    streamed_direct = run_to_end(tiny_engine.stream(QUESTION, [doc]))  # the stream returns its Answer
    assert streamed_direct.token_ids == whole.token_ids and streamed_direct.cache_hits == 1


def test_closing_a_stream_early_releases_the_model_lock(make_runtime):
    runtime = make_runtime(scheduler=False)
    runtime.documents.ingest("default", "paris", PARIS, "Paris")
    queries = runtime.queries
    events = queries.stream(queries.plan("default", QUESTION, ["paris"]))
    assert next(events)[0] == "token"
    deadline = time.monotonic() + 10  # held per scheduler step, never for a client that does not read on
    while runtime.model_lock.locked() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not runtime.model_lock.locked()
    events.close()
    assert not runtime.model_lock.locked()


def test_closing_a_scheduled_stream_early_frees_its_slot(make_runtime):
    runtime = make_runtime(max_new_tokens=64)
    runtime.documents.ingest("default", "paris", PARIS, "Paris")
    queries = runtime.queries
    events = queries.stream(queries.plan("default", QUESTION, ["paris"], max_new_tokens=64))
    assert next(events)[0] == "token"
    events.close()
    deadline = time.monotonic() + 10
    while runtime.scheduler.stats()["running"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runtime.scheduler.stats()["running"] == 0
    assert runtime.scheduler.tree.stats()["pinned_nodes"] == 0


def test_planning_errors_are_service_errors_with_a_status(runtime):
    with pytest.raises(ServiceError) as e:
        runtime.queries.plan("default", QUESTION, ["nope"])
    assert (e.value.status, e.value.code) == (404, "document_not_found")
    with pytest.raises(ServiceError) as e:
        runtime.queries.plan("default", "  ")
    assert (e.value.status, e.value.code) == (422, "invalid_question")


def test_the_fair_admission_policy_counts_each_queries_tenant(make_runtime):
    rt = make_runtime(admission_policy="fair")
    for tenant in ("acme", "globex"):
        rt.documents.ingest(tenant, "paris", PARIS, "Paris")
    rt.queries.answer(rt.queries.plan("acme", QUESTION, ["paris"]))
    assert set(rt.scheduler.policy.counters) == {"acme"}
    rt.queries.answer(rt.queries.plan("globex", QUESTION, ["paris"]))
    counters = rt.scheduler.policy.counters
    assert set(counters) == {"acme", "globex"} and counters["globex"] > counters["acme"] > 0  # lifted, then charged


def test_a_document_the_busy_store_could_not_take_is_not_marked_failed(runtime, monkeypatch):
    # A put refused because a reader held the space (StoreBusyError) is transient: the query answers from memory
    # and the record stays as it was (a too-large document is marked failed; this one can be stored later).
    from store.lmdb_env import StoreBusyError

    def busy(key, record):
        raise StoreBusyError("no room for k: pid 7 reads a snapshot older than the space freed")

    monkeypatch.setattr(runtime.store.blobs, "put_record", busy)
    queries = runtime.queries
    assert runtime.store.index.get("default", "paris").status == "queued"  # queue "none": encoded by the query
    result = queries.answer(queries.plan("default", QUESTION, ["paris"]))
    assert result.token_ids and runtime.store.index.get("default", "paris").status == "queued"

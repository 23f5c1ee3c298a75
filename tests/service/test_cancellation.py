"""A cancelled request stops: waiting, it is never admitted and its reader wakes at once; being admitted, it
stops loading its documents after the one in hand (kept in the cache) and unpins its prefix-tree path."""

from __future__ import annotations

import copy
import threading
import time

import pytest

from factories import tiny_text_engine
from kvlink_rag.cache import MemoryCache
from kvlink_rag.runtime.prefix_tree import PrefixTree
from kvlink_rag.types import Document
from kvlink_rag.runtime.cancel import Cancelled
from service.cancellation import CancelScope, RequestCancelled, bind, check_cancelled, on_cancel, unbind
from kvlink_rag.runtime.gen_request import GenRequest
from kvlink_rag.runtime.limits import SchedulerLimits
from kvlink_rag.runtime.scheduler import Scheduler

DOCS = [Document(f"Document {i} tells the story of harbour number {i}, its ships and its {i * 3} cranes.")
        for i in range(8)]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return tiny_text_engine(tmp_path_factory.mktemp("cancel"), max_new_tokens=4, kv_dtype="float32")


def _request(engine, docs, make_engine=None) -> GenRequest:
    ids = engine.template.question_ids(engine.lm.tokenizer, "which harbour?").tolist()
    return GenRequest(make_engine or (lambda: engine), docs, ids, engine.sampling())


def _counting(engine, on_encode=None):
    """A copy of ``engine`` with a fresh cache whose ``encode`` calls are listed (and may call ``on_encode``)."""
    eng = copy.copy(engine)
    eng.cache, encoded = MemoryCache(), []

    def encode(doc):
        encoded.append(doc)
        if on_encode is not None:
            on_encode()
        return engine.encode(doc)

    eng.encode = encode
    return eng, encoded


def _wait_step(sched, n: int) -> None:
    """Wait until the scheduler has finished ``n`` steps (at most 10 s)."""
    deadline = time.monotonic() + 10
    while sched.steps < n and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_request_cancelled_while_loading_stops_after_the_document_in_hand(engine):
    tree = PrefixTree(1 << 30)
    sched = Scheduler(engine.lm, tree, threading.Lock(), SchedulerLimits())
    handle_box: list = []
    eng, encoded = _counting(engine, on_encode=lambda: handle_box[0].cancel())  # the client leaves meanwhile
    try:
        handle_box.append(sched.submit(_request(engine, DOCS[:5], lambda: eng)))
        with pytest.raises(Cancelled):
            list(handle_box[0].tokens())  # the reader wakes at once, while the scheduler is still loading
        _wait_step(sched, 1)
        assert len(encoded) == 1 and len(eng.cache) == 1  # 4 documents never encoded; the one in hand kept
        assert not sched.busy() and tree.stats()["pinned_nodes"] == 0
        assert list(sched.submit(_request(engine, DOCS[:2])).tokens())  # the scheduler goes on serving
    finally:
        sched.close()


def test_a_waiting_request_cancelled_is_never_admitted_and_its_reader_wakes_at_once(engine):
    lock = threading.Lock()
    sched = Scheduler(engine.lm, PrefixTree(1 << 30), lock, SchedulerLimits())
    eng, encoded = _counting(engine)
    try:
        with lock:  # the model is busy (e.g. a long precompute chunk): requests wait in the queue
            handle = sched.submit(_request(engine, DOCS[5:8], lambda: eng))
            woke = []
            reader = threading.Thread(target=lambda: woke.append(pytest.raises(Cancelled, list,
                                                                               handle.tokens())))
            reader.start()
            time.sleep(0.05)
            handle.cancel()
            reader.join(5)
            assert woke and not reader.is_alive()  # released while the model is still busy
        _wait_step(sched, 1)
        assert encoded == [] and not sched.busy()
    finally:
        sched.close()


def test_a_cancel_scope_runs_its_callbacks_once_and_binds_per_context():
    scope, calls = CancelScope(), []
    token = bind(scope)
    try:
        on_cancel(lambda: calls.append("a"))
        check_cancelled()
        scope.cancel()
        scope.cancel()
        on_cancel(lambda: calls.append("late"))  # registered after the cancel: runs at once
        assert calls == ["a", "late"]
        with pytest.raises(RequestCancelled) as e:
            check_cancelled("the query")
        assert e.value.status == 499 and e.value.code == "cancelled"
    finally:
        unbind(token)
    check_cancelled()  # no scope: nothing to cancel

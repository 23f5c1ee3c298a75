"""A thread gives back its OpenMP workers: the team of the thread that runs the model is then the only one."""

import os
import threading

import pytest
import torch

from kvlink_rag.omp_pool import release_thread_pool, serial_thread


def _os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _tids() -> set[str]:
    return set(os.listdir("/proc/self/task"))


@pytest.mark.skipif(torch.get_num_threads() < 2 or not os.path.isdir("/proc/self/task"),
                    reason="needs two torch threads and Linux's /proc")
def test_release_frees_the_calling_threads_openmp_workers():
    """By thread ids, not counts: threads other tests left behind may start or end meanwhile (a count once read 10
    after the release as before it, in the whole suite)."""
    seen = {}

    def work():
        before = _tids()
        torch.ones(4_000_000).mul_(2)  # a parallel region: this thread's team starts
        seen["team"] = _tids() - before
        seen["released"] = release_thread_pool()
        seen["after"] = _tids()
        torch.ones(4_000_000).mul_(2)  # a later region gets a new team
        seen["again"] = _tids() - seen["after"]
        release_thread_pool()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    workers = torch.get_num_threads() - 1
    assert seen["released"] is True
    assert len(seen["team"]) >= workers  # the team's workers (and any thread started meanwhile)
    assert len(seen["team"] - seen["after"]) >= workers  # the workers are gone after the release
    assert len(seen["again"]) >= workers  # and a new team starts for the next region


def test_release_without_a_team_is_harmless():
    assert release_thread_pool() in (True, False)
    assert release_thread_pool() in (True, False)
    assert float(torch.ones(10).sum()) == 10.0


def test_a_submitting_thread_hands_its_team_to_the_scheduler(monkeypatch):
    import kvlink_rag.runtime.scheduler as sched
    from kvlink_rag.runtime.prefix_tree import PrefixTree

    calls = []
    monkeypatch.setattr(sched, "release_thread_pool", lambda: calls.append(threading.current_thread().name))
    s = sched.Scheduler(object(), PrefixTree(0), threading.Lock())
    assert calls == [threading.current_thread().name]  # the thread that built it (and loaded the model)
    s.close()


@pytest.mark.skipif(torch.get_num_threads() < 2 or not os.path.isdir("/proc/self/task"),
                    reason="needs two torch threads and Linux's /proc")
def test_a_serial_thread_opens_no_team_and_leaves_the_others_setting_alone():
    seen = {}

    def work():
        before = _os_threads()
        seen["took"] = serial_thread()
        x = torch.ones(4_000_000)
        x.mul_(2)  # would open a team on two threads
        seen["extra"] = _os_threads() - before
        seen["sum"] = float(x.sum())

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen == {"took": True, "extra": 0, "sum": 8_000_000.0}
    assert torch.get_num_threads() >= 2  # this thread's setting untouched

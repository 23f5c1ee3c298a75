"""A thread gives back its OpenMP workers: the team of the thread that runs the model is then the only one."""

import os
import threading

import pytest
import torch

from kvlink_rag.omp_pool import release_thread_pool, serial_thread


def _os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(torch.get_num_threads() < 2 or not os.path.isdir("/proc/self/task"),
                    reason="needs two torch threads and Linux's /proc")
def test_release_frees_the_calling_threads_openmp_workers():
    seen = {}

    def work():
        torch.ones(4_000_000).mul_(2)  # a parallel region: this thread's team starts
        seen["with_team"] = _os_threads()
        seen["released"] = release_thread_pool()
        seen["after"] = _os_threads()
        torch.ones(4_000_000).mul_(2)  # a later region gets a new team
        seen["again"] = _os_threads()
        release_thread_pool()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen["released"] is True
    assert seen["after"] == seen["with_team"] - (torch.get_num_threads() - 1)
    assert seen["again"] == seen["with_team"]


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

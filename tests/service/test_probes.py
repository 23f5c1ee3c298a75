"""Readiness checks in the background: results are cached, a hung check is reported failing after its timeout
and never started twice, and it is reported ok again once it answers."""

from __future__ import annotations

import threading

from service.probes import NOT_CHECKED, ProbeMonitor
from service_support import wait_for


def test_a_hung_check_is_reported_failing_after_its_timeout_and_not_started_twice():
    release, calls = threading.Event(), []

    def hangs():
        calls.append(1)
        release.wait(10)

    monitor = ProbeMonitor({"fast": (lambda: None, "down"), "slow": (hangs, "Redis unreachable")},
                           interval_s=0.05, timeout_s=0.2)
    monitor.start(first_wait_s=0.05)
    try:
        first = monitor.results()
        # the first round did not wait for the hung check (10 s): not checked yet, or on a machine slow enough
        # that its 0.2 s timeout passed before this line, already reported failing
        assert first["fast"] == "ok" and not release.is_set()
        assert first["slow"] == NOT_CHECKED or first["slow"].startswith("Redis unreachable: no answer within 0.2 s")
        wait_for(lambda: monitor.results()["slow"] != NOT_CHECKED, 5, interval=0.02, what="the hung check reported")
        slow = monitor.results()["slow"]
        assert slow.startswith("Redis unreachable: no answer within 0.2 s")
        monitor.poke()
        assert len(calls) == 1  # still the one call: a hung dependency holds one thread, not one per round
        release.set()
        wait_for(lambda: monitor.results()["slow"] == "ok", 5, interval=0.02, what="the check answering again")
    finally:
        release.set()
        monitor.close()


def test_a_failing_check_names_its_error():
    def refused():
        raise ConnectionError("Connection refused")

    monitor = ProbeMonitor({"index": (refused, "Redis unreachable")}, interval_s=1.0, timeout_s=1.0)
    monitor.start()
    try:
        assert monitor.results() == {"index": "Redis unreachable: Connection refused"}
    finally:
        monitor.close()

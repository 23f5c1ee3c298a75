"""The fleet picture: events applied in order on a snapshot, a gap or a restart resyncs, a silent replica is
dropped (a real Redis: a claimed DB of the shared server)."""

import json

import pytest
import redis

from router.fleet import Fleet, ReplicaState
from service.cache_publisher import CachePublisher, registration_key, snapshot_request_key
from service_support import claimed_redis_db, wait_for


def ev(seq, op, tier="host", key="k", epoch="e1", **extra):
    return {"epoch": epoch, "seq": str(seq), "op": op, "tier": tier, "key": key, **extra}


def test_events_apply_on_the_snapshot_and_a_gap_asks_for_another():
    r = ReplicaState("http://a", id="a", epoch="e1")
    assert r.apply(ev(1, "stored"))  # before any snapshot: ignored
    assert r.held == {}
    assert r.apply({"epoch": "e1", "seq": "2", "op": "snapshot", "data": json.dumps([["host", "x", 5], ["local", "x", 0]])})
    assert r.held == {"x": {"host", "local"}} and r.synced
    assert r.apply(ev(3, "stored", key="y")) and r.apply(ev(4, "removed", key="x", tier="host"))
    assert r.held == {"x": {"local"}, "y": {"host"}}
    assert not r.apply(ev(6, "stored", key="z"))  # 5 is missing
    assert r.apply(ev(1, "stored", epoch="old"))  # another epoch's leftovers change nothing
    assert "z" in r.held and r.seq == 6


@pytest.fixture
def url():
    with claimed_redis_db() as u:
        yield u


def test_a_publisher_is_seen_its_gap_resynced_and_its_silence_dropped(url):
    client = redis.Redis.from_url(url)
    held = [("host", "k1", 10)]
    pub = CachePublisher(client, "rep-a", "http://127.0.0.1:1", lambda: list(held),
                         lambda: {"running": 2, "waiting": 1, "queued_prefill_tokens": 30}, interval_s=0.1, ttl_s=0.5)
    pub.start()
    fleet = Fleet(client, dead_after_s=0.6)
    try:
        wait_for(lambda: client.exists(registration_key("rep-a")), 5)
        fleet.poll()
        rep = fleet.replicas["http://127.0.0.1:1"]
        wait_for(lambda: fleet.poll() or rep.synced, 5, what="snapshot after discovery")
        assert rep.held == {"k1": {"host"}} and rep.view().running == 2 and rep.view().queued_prefill_tokens == 30
        pub.stored("host", "k2", 20, 100)
        wait_for(lambda: fleet.poll() or "k2" in rep.held, 5)
        with pub._lock:  # an event lost on the way (as when the publisher's queue overflows)
            pub.seq += 1
        held.append(("cold", "k3", 7))
        pub.removed("host", "k1")
        wait_for(lambda: fleet.poll() or rep.resyncs >= 2, 5, what="the gap noticed")
        wait_for(lambda: fleet.poll() or (rep.synced and "k3" in rep.held), 5, what="resynced by a snapshot")
        assert rep.held["k3"] == {"cold"}
    finally:
        pub.close()
    assert not client.exists(registration_key("rep-a"))
    wait_for(lambda: fleet.poll() or not fleet.replicas, 5, what="the silent replica dropped")
    client.delete(snapshot_request_key("rep-a"))


def test_a_heartbeat_older_than_the_last_finished_request_is_not_counted():
    r = ReplicaState("http://a", id="a", load={"running": 3, "waiting": 1, "queued_prefill_tokens": 50, "time": 100.0})
    assert (r.view().running, r.view().queued_prefill_tokens) == (3, 50)
    r.last_done, r.in_flight = 100.5, 1
    assert (r.view().running, r.view().waiting, r.view().in_flight) == (0, 0, 1)

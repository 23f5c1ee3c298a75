"""Eviction policies: exact LRU and Fair-LRU orders for scripted access sequences."""

from __future__ import annotations

import pytest

from store.tiers.policies import FairPolicy, LRUPolicy, utility
from store.tiers.tier import CacheTier, entry_nbytes


@pytest.fixture
def small(make_kv):
    """Factory of equal-sized tiny documents (160 bytes each)."""
    return lambda seed=0: make_kv(layers=1, heads=1, tokens=4, dim=4, seed=seed)


def scripted_tier(policy, n_entries, small, clock):
    unit = entry_nbytes(small())
    assert unit == 160  # K and V 2 x 16 float32 + 4 int64 ids
    tier = CacheTier("host", n_entries * unit, policy=policy, clock=clock)
    evicted: list[str] = []
    tier.on_evict = lambda e: evicted.append(e.key)
    return tier, evicted


def flood_script(tier, small, clock):
    """Tenant B caches 3 documents and reads each twice; tenant A then floods 10 documents;
    B adds 2 more."""
    for k in ["b1", "b2", "b3"]:
        clock.advance(1)
        tier.put(k, small(), "B")
    for k in ["b1", "b2", "b3"] * 2:
        clock.advance(1)
        assert tier.get(k, "B") is not None
    for i in range(1, 11):
        clock.advance(1)
        tier.put(f"a{i}", small(i), "A")
    for k in ["b4", "b5"]:
        clock.advance(1)
        tier.put(k, small(), "B")


def test_lru_evicts_least_recently_used(small, clock):
    tier, evicted = scripted_tier(LRUPolicy(), 3, small, clock)
    for k in "abc":
        tier.put(k, small(), "t")
    tier.get("a", "t")
    tier.put("d", small(), "t")
    tier.put("e", small(), "t")
    assert evicted == ["b", "c"] and tier.keys() == ["a", "d", "e"]


def test_lru_lets_a_flooding_tenant_evict_the_other_tenants_hot_documents(small, clock):
    tier, evicted = scripted_tier(LRUPolicy(), 8, small, clock)
    flood_script(tier, small, clock)
    assert evicted == ["b1", "b2", "b3", "a1", "a2", "a3", "a4"]
    assert sorted(k for k in tier.keys() if k.startswith("b")) == ["b4", "b5"]


def test_fair_policy_evicts_the_flooding_tenant_first(small, clock):
    tier, evicted = scripted_tier(FairPolicy(), 8, small, clock)
    flood_script(tier, small, clock)
    # a6..a10 each push A over its half (4 of 8 slots): A loses its own oldest. b4 fits B's half, so
    # A (5 slots, over quota) pays again; b5 would put B over its half, so B loses its oldest, b1.
    assert evicted == ["a1", "a2", "a3", "a4", "a5", "a6", "b1"]
    assert tier.keys() == ["b2", "b3", "a7", "a8", "a9", "a10", "b4", "b5"]
    assert tier.usage == {"A": 4 * 160, "B": 4 * 160}
    st = tier.stats()
    assert st["tenants"]["A"]["evictions"] == 6 and st["tenants"]["B"]["evictions"] == 1
    assert st["tenants"]["B"]["hits"] == 6 and st["evictions"] == 7


def test_fair_policy_is_lru_for_a_single_tenant(small, clock):
    tier, evicted = scripted_tier(FairPolicy(), 3, small, clock)
    for k in "xyz":
        clock.advance(1)
        tier.put(k, small(), "solo")
    tier.get("x", "solo")
    tier.put("w", small(), "solo")
    tier.put("v", small(), "solo")
    assert evicted == ["y", "z"]


def test_fair_policy_falls_back_to_lowest_utility(small, clock):
    tier, evicted = scripted_tier(FairPolicy(), 4, small, clock)  # quotas: 2 entries each
    for t, k, tenant in [(1, "a1", "A"), (2, "a2", "A"), (3, "b1", "B"), (9, "b2", "B")]:
        clock.t = t
        tier.put(k, small(), tenant)
    for t in [6, 7, 8]:
        clock.t = t
        tier.get("b1", "B")
    clock.t = 10
    with tier.pinned(["a1", "a2"]):
        # A is over its quota with a3 but has nothing evictable; of B's entries, b1 is the least
        # recently used but b2 has the lower utility: b1 (1+3)/(1+2) = 1.33, b2 (1+0)/(1+1) = 0.5.
        assert utility(tier.entries["b1"], 10) == pytest.approx(4 / 3)
        assert utility(tier.entries["b2"], 10) == pytest.approx(0.5)
        tier.put("a3", small(), "A")
    assert evicted == ["b2"]
    assert tier.keys() == ["a1", "a2", "b1", "a3"]


def test_weighted_quotas(small, clock):
    tier, _ = scripted_tier(FairPolicy({"A": 3.0}), 8, small, clock)
    tier.put("b", small(), "B")
    assert tier.policy.quotas(tier, "A") == {"A": 6 * 160, "B": 2 * 160}
    assert tier.policy.quotas(tier) == {"B": 8 * 160}  # an absent tenant's share is lent out
    with pytest.raises(ValueError):
        FairPolicy({"A": 0})


@pytest.mark.parametrize("policy", [LRUPolicy(), FairPolicy()])
def test_pinned_entries_are_never_evicted(policy, small, clock):
    tier, evicted = scripted_tier(policy, 2, small, clock)
    tier.put("p", small(), "t")
    tier.put("q", small(), "t")
    with tier.pinned(["p", "q", "absent"]) as pinned:
        assert pinned == ["p", "q"]
        assert tier.put("r", small(), "t") is None  # no room: everything pinned
        assert tier.stats()["rejected"] == 1 and evicted == []
    assert tier.pin("p")
    tier.put("r", small(), "t")
    assert evicted == ["q"]
    tier.unpin("p")
    with pytest.raises(KeyError):
        tier.unpin("p")

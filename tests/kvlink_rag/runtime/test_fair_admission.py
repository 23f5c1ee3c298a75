"""Fair admission (virtual token counters) on fake waiting views: who goes next, and what counters hold."""

from __future__ import annotations

from kvlink_rag.decoding.generate import SamplingParams
from kvlink_rag.runtime.admission import FifoPolicy, WaitingView
from kvlink_rag.runtime.fair_admission import FairPolicy
from kvlink_rag.runtime.gen_request import GenRequest
from kvlink_rag.runtime.policies import make_policy
from kvlink_rag.types import Document
from service.settings import ServiceSettings

A, B, C = (Document(f"text {x}", x) for x in "ABC")


def view(tenant: str, tokens: int, docs=(), bucket: str | None = None, starved: bool = False) -> WaitingView:
    req = GenRequest(lambda: None, list(docs), [1] * tokens, SamplingParams(), tenant=tenant)
    bucket = bucket or ("short" if tokens < 64 else "medium" if tokens < 256 else "long")
    return WaitingView(req, tokens, bucket, 5.0 if starved else 0.1, starved)


def admit_one_by_one(policy, waiting: list[WaitingView]) -> list[str]:
    """Admit the policy's first choice, report it as served, repeat: ``tenant:tokens`` in admission order."""
    admitted = []
    while waiting:
        i = policy.order(waiting, [])[0]
        w = waiting.pop(i)
        if hasattr(policy, "served"):
            policy.served(w.request, w.tokens, 0)
        admitted.append(f"{w.request.tenant}:{w.tokens}")
    return admitted


def test_a_tenant_sending_only_long_requests_cannot_starve_anothers_short_ones():
    waiting = [view("long", 4096) for _ in range(4)] + [view("short", 32) for _ in range(4)]
    assert admit_one_by_one(FifoPolicy(), list(waiting)) == ["long:4096"] * 4 + ["short:32"] * 4
    # equal counters at first (arrival decides), then the long tenant owes 4096 tokens: every short goes first
    assert admit_one_by_one(FairPolicy(), list(waiting)) == ["long:4096"] + ["short:32"] * 4 + ["long:4096"] * 3


def test_counters_grow_with_prompt_and_output_tokens():
    p = FairPolicy(prompt_weight=1.0, output_weight=2.0)
    req = view("t", 100).request
    p.served(req, 100, 0)
    for _ in range(5):
        p.served(req, 0, 1)
    assert p.counters == {"t": 110.0}


def test_a_new_tenant_is_lifted_to_the_smallest_counter_of_the_waiting_ones():
    p = FairPolicy()
    old = [view("a", 500), view("b", 500)]
    p.order(old, [])
    p.counters.update(a=10_000.0, b=7_000.0)
    newcomer = view("c", 10)
    order = p.order(old + [newcomer], [])
    assert p.counters["c"] == 7_000.0  # not 0: no credit for having been away
    assert order == [1, 2, 0]  # b and c tie at 7000 (b arrived first), b is charged its 500, then c, then a


def test_an_idle_tenant_returning_is_lifted_but_keeps_a_higher_counter():
    p = FairPolicy()
    p.counters.update(a=10_000.0, b=100.0, c=50_000.0)
    waiting = [view("a", 500)]
    p.order(waiting, [])
    p.order(waiting + [view("b", 10), view("c", 10)], [])
    assert p.counters["b"] == 10_000.0 and p.counters["c"] == 50_000.0


def test_with_nobody_waiting_a_new_tenant_starts_at_the_last_one_to_leave():
    p = FairPolicy()
    w = view("a", 500)
    p.order([w], [])
    p.served(w.request, 500, 0)
    p.order([], [])  # a's request was admitted: the queue emptied
    p.order([view("b", 10)], [])
    assert p.counters["b"] == 500.0


def test_locality_breaks_ties_between_tenants_and_orders_a_tenants_own_requests():
    running = [GenRequest(lambda: None, [C], [1], SamplingParams())]
    waiting = [view("a", 10, [A]), view("b", 10, [C])]
    assert FairPolicy().order(waiting, running) == [1, 0]  # equal counters: b's documents are warm
    assert FairPolicy(locality_bonus=0).order(waiting, running) == [0, 1]  # no bonus: arrival
    # a bonus is small: 128 tokens of counter do not outweigh being 1000 tokens further ahead
    p = FairPolicy()
    p.order(waiting, running)
    p.counters.update(a=0.0, b=1000.0)
    assert p.order(waiting, running)[0] == 0
    own = [view("a", 10, [A]), view("a", 10, [B, C])]
    assert FairPolicy().order(own, running) == [1, 0]


def test_within_a_tenant_starved_requests_then_the_first_picks_bucket():
    waiting = [view("a", 300), view("a", 10), view("a", 400), view("a", 20, starved=True)]
    assert FairPolicy().order(waiting, []) == [3, 1, 0, 2]  # starved short, then the short bucket, then long


def test_the_policy_is_selectable_by_setting():
    assert isinstance(make_policy("fair"), FairPolicy)
    assert isinstance(make_policy("fifo"), FifoPolicy)
    assert ServiceSettings(admission_policy="fair").admission_policy == "fair"


def test_past_its_depth_the_order_is_arrival():
    waiting = [view("long", 4096), view("long", 4096), view("short", 8), view("short", 8)]
    assert FairPolicy().order(waiting, []) == [0, 2, 3, 1]
    assert FairPolicy(depth=2).order(waiting, []) == [0, 2, 1, 3]

"""``kvlink-rag bench --suites fairness``: one tenant's long requests against another's short ones, per
admission policy, side by side in one run (issue 27).

The engine's model behind a :class:`~kvlink_rag.runtime.scheduler.Scheduler` in this process (no HTTP: only the
admission order differs between rows). Tenant ``long`` runs ``long_clients`` closed-loop clients, each
sending ``long_tokens``-token prompts back to back (mode ``full``, cold: every token is prefilled); tenant
``short`` sends a request every ``gap_s`` seconds (open loop: its arrivals do not wait for its answers),
sized short / medium / long in the design notes' 60/30/10 mix (``sizes``, tokens). ``max_running`` slots
are fewer than the long tenant's clients, so a queue forms and the admission order matters. The long
clients' first prompts are staggered (1/4, 2/4, ... of ``long_tokens``) so slots free at spread-out times
from the start, as in a steady state. Each policy runs ``window_s`` seconds of arrivals, then the short
tenant's outstanding requests finish (at most ``drain_s`` more) and everything left is cancelled.

Reported per policy: the short tenant's TTFT and end-to-end latency p50 / p99 (seconds, from submission;
a request still unfinished counts as its wait until the cancellation, and the quantile is then marked a
lower bound), its e2e over its short-bucket requests only, the long tenant's finished requests (what
fairness costs it) and the scheduler's steps per second (the pace of a shared machine in that row).
"""

from __future__ import annotations

import random
import threading
import time

POLICIES = ("fifo", "buckets", "fair")
SIZES = (32, 192, 768)  # tokens: short (< 128), medium (128-512), long (> 512), as in the design notes
MIX = (0.6, 0.3, 0.1)


def _pct(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of ``values``, None when empty."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _pct_censored(values: list[tuple[float, bool]], q: float) -> tuple[float | None, bool]:
    """``(quantile, whether it is a lower bound)`` of ``(seconds, unfinished)`` pairs (an unfinished request
    counts as its wait until it was cancelled: the quantile is then at least that)."""
    if not values:
        return None, False
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _token_pool(engine, examples, need: int) -> list[int]:
    """At least ``need`` token ids of NQ passages (real text, so the prompts are like real ones)."""
    tok = engine.lm.tokenizer
    ids: list[int] = []
    for e in examples:
        ids += tok(e.gold.text, add_special_tokens=False)["input_ids"]
        if len(ids) >= need:
            return ids
    return (ids * (need // max(1, len(ids)) + 1))[:need] if ids else list(range(10, 10 + need))


def _request(engine, pool: list[int], n: int, offset: int, tenant: str, max_new_tokens: int):
    from kvlink_rag.runtime.gen_request import GenRequest

    start = offset % max(1, len(pool) - n)
    return GenRequest(lambda: engine, [], pool[start:start + n], engine.sampling(max_new_tokens=max_new_tokens,
                      temperature=0.0), "full", tenant=tenant, cold=True)


def _long_client(sched, engine, pool: list[int], p: dict, c: int, stop: threading.Event, lock: threading.Lock,
                 handles: list, done: list) -> None:
    """Long client ``c``: one prompt after another until ``stop`` (its handles in ``handles``, the e2e seconds
    of those that finished in ``done``)."""
    k = 0
    while not stop.is_set():
        # first prompts staggered (1/4, 2/4, ... of long_tokens): the slots free at spread-out times from the
        # start, as in a steady state, instead of all long requests ending together
        n = p["long_tokens"] * (c + 1) // p["long_clients"] if k == 0 else p["long_tokens"]
        h = sched.submit(_request(engine, pool, n, 997 * c + 131 * k, "long", p["max_new_tokens"]))
        with lock:
            handles.append(h)
        if stop.is_set():  # the window closed while it was submitted: the cleanup may have missed it
            h.cancel()
        try:
            list(h.tokens())
            done.append(h.result.timings["total_s"])
        except Exception:  # noqa: BLE001 - cancelled at the end of the window
            return
        k += 1


def _read(h) -> None:
    """Read a short request's answer to the end (failed or cancelled after the drain: reported unfinished)."""
    try:
        list(h.tokens())
    except Exception:  # noqa: BLE001
        pass


def _one_policy(engine, pool: list[int], policy: str, arrivals: list[int], p: dict) -> dict:
    """Run one policy (``p``: the suite's parameters); the row of :func:`fairness_suite`."""
    from kvlink_rag.runtime.policies import make_policy
    from kvlink_rag.runtime.prefix_tree import PrefixTree
    from kvlink_rag.runtime.limits import SchedulerLimits
    from kvlink_rag.runtime.scheduler import Scheduler

    sched = Scheduler(engine.lm, PrefixTree(0), threading.Lock(), SchedulerLimits(max_running=p["max_running"]),
                      policy=make_policy(policy))
    short: list[tuple[int, object]] = []  # (tokens, handle)
    long_done, stop, lock = [], threading.Event(), threading.Lock()
    long_handles: list = []

    threads = [threading.Thread(target=_long_client, args=(sched, engine, pool, p, c, stop, lock, long_handles, long_done),
                                daemon=True) for c in range(p["long_clients"])]
    readers = []
    try:
        for t in threads:
            t.start()
        t0 = time.perf_counter()
        for i, n in enumerate(arrivals):
            time.sleep(max(0.0, t0 + i * p["gap_s"] - time.perf_counter()))
            h = sched.submit(_request(engine, pool, n, 7919 * i, "short", p["max_new_tokens"]))
            short.append((n, h))
            readers.append(threading.Thread(target=_read, args=(h,), daemon=True))
            readers[-1].start()
        stop.set()
        end = time.perf_counter() + p["drain_s"]
        for r in readers:
            r.join(max(0.0, end - time.perf_counter()))
    finally:
        stop.set()
        ended, steps = time.perf_counter(), sched.steps
        sched.close()  # waiting and running requests fail; their readers return
        with lock:
            for h in long_handles + [h for _, h in short]:
                h.cancel()
        for t in threads + readers:
            t.join(5)
    row = {"short_requests": len(short), "short_finished": sum(h.result is not None for _, h in short),
           "long_finished": len(long_done), "long_e2e_p50_s": _pct(long_done, 0.5),
           "steps_per_s": steps / max(1e-9, ended - t0)}  # the machine's pace in this row (it is shared)
    return {**row, **_short_quantiles(short, ended, p["sizes"][0])}


def _short_quantiles(short: list, ended: float, smallest: int) -> dict:
    """p50 / p99 of the short tenant's TTFT, e2e and e2e of its ``smallest``-token requests (seconds; an
    unfinished request counts as its wait until ``ended``, the quantile then flagged ``_lower_bound``)."""
    row = {}
    for name, kind, only in (("short_ttft", "ttft_s", None), ("short_e2e", "total_s", None),
                             ("short_bucket_e2e", "total_s", smallest)):
        values = [(h.result.timings.get(kind, h.result.timings["total_s"]), False) if h.result is not None
                  else (ended - h.request.t0, True) for n, h in short if only is None or n == only]
        for q in (50, 99):
            row[f"{name}_p{q}_s"], row[f"{name}_p{q}_lower_bound"] = _pct_censored(values, q / 100)
    return row


def fairness_suite(engine, examples, policies: tuple[str, ...] = POLICIES, window_s: float = 50.0,
                   gap_s: float = 2.0, long_tokens: int = 4096, long_clients: int = 4, max_running: int = 2,
                   sizes: tuple[int, int, int] = SIZES, mix: tuple[float, float, float] = MIX,
                   max_new_tokens: int = 4, drain_s: float = 60.0, seed: int = 0, log=print) -> dict:
    """The policies side by side (see the module docstring); ``{setup, policies: {policy: row}}`` (seconds).

    Raises:
        ValueError: an unknown policy name.
    """
    rng = random.Random(seed)
    arrivals = rng.choices(list(sizes), weights=list(mix), k=max(1, int(window_s / gap_s)))
    pool = _token_pool(engine, examples, 4 * long_tokens)
    p = dict(long_tokens=long_tokens, long_clients=long_clients, max_running=max_running, gap_s=gap_s,
             drain_s=drain_s, max_new_tokens=max_new_tokens, sizes=list(sizes))
    out = {"setup": dict(p, window_s=window_s, mix=list(mix), short_arrivals=len(arrivals),
                         arrival_sizes={n: arrivals.count(n) for n in sizes},
                         note="one process, the engine's model; ratios between rows of this run only"),
           "policies": {}}
    for policy in policies:
        log(f"fairness: policy {policy}")
        out["policies"][policy] = _one_policy(engine, pool, policy, arrivals, p)
    return out


def fairness_section(results: dict) -> list[str]:
    """The BENCHMARKS.md table of :func:`fairness_suite`'s results (``results["fairness"]``)."""
    f = results["fairness"]
    s = f["setup"]

    def sec(r, key) -> str:
        v = r[f"{key}_s"]
        return "n/a" if v is None else (">= " if r.get(f"{key}_lower_bound") else "") + f"{v:.1f} s"

    lines = ["## Fair admission: a long-request tenant against a short-request tenant", "",
             f"Tenant `long`: {s['long_clients']} closed-loop clients of {s['long_tokens']}-token prompts; tenant "
             f"`short`: one request every {s['gap_s']} s for {s['window_s']} s ({s['short_arrivals']} requests of "
             f"{'/'.join(str(n) for n in s['sizes'])} tokens, 60/30/10); {s['max_running']} running slots, mode full, "
             f"{s['max_new_tokens']} new tokens. A request unfinished when the run stopped counts as its wait until "
             "then (>=: a lower bound).", "",
             "| policy | short TTFT p50 | short TTFT p99 | short e2e p50 | short e2e p99 | short-bucket e2e p50 "
             "| short finished | long finished | steps/s |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in f["policies"].items():
        lines.append(f"| {name} | {sec(r, 'short_ttft_p50')} | {sec(r, 'short_ttft_p99')} | {sec(r, 'short_e2e_p50')} "
                     f"| {sec(r, 'short_e2e_p99')} | {sec(r, 'short_bucket_e2e_p50')} "
                     f"| {r['short_finished']}/{r['short_requests']} | {r['long_finished']} | {r['steps_per_s']:.2f} |")
    return lines

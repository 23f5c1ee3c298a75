"""Serving benchmarks of the batching scheduler (issue 13), side by side in one run, on the service layer
(:class:`service.queries.QueryService` over a runtime; clients are threads):

* linked NQ queries (10 cached documents, 24 new tokens, greedy): throughput and p50/p99 latency at 1, 4
  and 16 concurrent clients, scheduler on and (at the highest level) off, next to the compute floor;
* 16 concurrent 5-turn dialogues over the same documents and system prompt: throughput, peak resident KV
  bytes and TTFT per turn, prefix sharing on vs off;
* a short cached query's latency while a ~4k-token document is precomputed vs idle.
"""

from __future__ import annotations

from evaluation.nq import NQExample
from kvlink_rag.engine import Engine

from .dialogues import dialogues
from .interference import precompute_interference
from .serving_nq import nq_throughput


def serving_suite(engine: Engine, examples: list[NQExample], clients: list[int], log=print) -> dict:
    """The three serving workloads (see the module docstring)."""
    return {"nq": nq_throughput(engine, examples, clients, log=log), "dialogues": dialogues(engine, examples, log=log),
            "interference": precompute_interference(engine, examples, log=log)}

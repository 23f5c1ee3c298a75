"""Helpers of the scheduler tests: their documents and questions, a scheduler over a tiny engine, requests,
running a batch of them."""

from __future__ import annotations

import threading

from kvlink_rag.runtime.gen_request import GenRequest
from kvlink_rag.runtime.limits import SchedulerLimits
from kvlink_rag.runtime.prefix_tree import PrefixTree
from kvlink_rag.runtime.scheduler import Scheduler
from kvlink_rag.types import Document

DOCS = [Document(f"Document number {i} says the code word is kiwi{i} and other things {i * 7}.", f"T{i}")
        for i in range(6)]
QUESTIONS = ["what is the code word?", "which number?", "who wrote it and when?", "say kiwi"]


def make_scheduler(engine, budget=1 << 30, **limits) -> Scheduler:
    return Scheduler(engine.lm, PrefixTree(budget), threading.Lock(), SchedulerLimits(**limits))


def request(engine, question, docs, mode="linked", **sampling) -> GenRequest:
    return GenRequest(lambda: engine, docs, engine.template.question_ids(engine.lm.tokenizer, question).tolist(),
                      engine.sampling(**sampling), mode)


def run_all(sched, reqs):
    """Submit ``reqs`` together; ``[(token ids as streamed, GenResult)]``."""
    handles = [sched.submit(r) for r in reqs]
    return [(list(h.tokens()), h.result) for h in handles]

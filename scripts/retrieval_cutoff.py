"""What the retrieval score cut-off costs and saves on NQ-open (BM25 only, no model; seconds on a CPU).

For each of ``--questions`` dev questions, a tenant of ``--docs`` passages (the gold one among other
questions' gold passages, :func:`kvlink_rag.nq.build_documents`) is indexed as the service indexes it
(:class:`service.retrieval.Retrieval`), the question retrieves its ``--top-k``, and the cut-off
(:func:`service.retrieval.above_cutoff`, ``--relative`` of the best score, ``--floor``) is applied. Prints
recall@k (the gold passage among those kept), documents kept per question and top-1 accuracy, without and
with the cut-off.

Usage: ``.venv/bin/python scripts/retrieval_cutoff.py [--nq PATH] [--questions 300] [--docs 10 50]``
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from kvlink_rag.nq import build_documents, load_nq
from service.retrieval import Retrieval, above_cutoff


@dataclass
class _Record:
    doc_id: str


class _Corpus:
    """One question's passages as both the index and the text store :class:`Retrieval` reads."""

    def __init__(self, texts: dict[str, str]):
        self.texts = texts

    def records(self, tenant):
        return [_Record(i) for i in self.texts]

    def get_intact(self, tenant, doc_id):
        return {"title": "", "text": self.texts[doc_id]}


def measure(examples, questions: int, n_docs: int, top_k: int, relative: float, floor: float) -> dict:
    """``{"without": (recall, docs per question, top-1), "with": (...), "questions": n}`` over the questions."""
    sums = {"without": [0, 0, 0], "with": [0, 0, 0]}
    n = 0
    for i in range(min(questions, len(examples))):
        try:
            docs, gold = build_documents(examples, i, n_docs, "random")
        except ValueError:  # too few passages without the answer
            continue
        corpus = _Corpus({f"d{j}": f"{d.title or ''}\n{d.text}" for j, d in enumerate(docs)})
        hits = Retrieval(corpus, corpus).search("t", examples[i].question, top_k)
        n += 1
        for name, kept in (("without", hits), ("with", above_cutoff(hits, relative, floor))):
            ids = [d for d, _ in kept]
            sums[name][0] += f"d{gold}" in ids
            sums[name][1] += len(ids)
            sums[name][2] += bool(ids) and ids[0] == f"d{gold}"
    return {"questions": n, **{k: tuple(v / max(n, 1) for v in s) for k, s in sums.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nq", default="../shared/data/nq-open-oracle-dev.jsonl.gz")
    p.add_argument("--questions", type=int, default=300)
    p.add_argument("--docs", type=int, nargs="+", default=[10, 50])
    p.add_argument("--top-k", type=int, default=3)
    p.add_argument("--relative", type=float, default=0.5)
    p.add_argument("--floor", type=float, default=0.0)
    a = p.parse_args()
    examples = load_nq(a.nq, limit=a.questions + 100)
    print(f"| candidates | questions | cut-off | recall@{a.top_k} | documents kept | top-1 |\n|---|---|---|---|---|---|")
    for n_docs in a.docs:
        m = measure(examples, a.questions, n_docs, a.top_k, a.relative, a.floor)
        for name in ("without", "with"):
            recall, kept, top1 = m[name]
            print(f"| {n_docs} | {m['questions']} | {name} | {recall:.3f} | {kept:.2f} | {top1:.3f} |")
    print(f"(cut-off: {a.relative} of the best score, floor {a.floor})")


if __name__ == "__main__":
    main()

"""Retrieval inside ``kvlink-rag eval`` (``--retrieve K``): each question's candidate passages (its gold
passage among distractors, as ``--docs`` builds them) are ranked by the service's BM25
(:func:`service.retrieval.rank`), the best ``K`` are kept, then the score cut-off
(:func:`service.retrieval.above_cutoff`) as the server applies it, and only those are linked: end-to-end
accuracy of retrieval plus answering. Also recall@k of the gold passage over the same candidates."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvlink_rag.types import Document
from service.retrieval import above_cutoff, rank

RECALL_KS = (1, 3, 5, 10)


def _texts(docs: list[Document]) -> list[str]:
    """The texts BM25 indexes, as the service indexes a document (title, newline, text)."""
    return [f"{d.title or ''}\n{d.text}" for d in docs]


@dataclass(frozen=True)
class Retrieve:
    """``top_k`` best candidates kept, then those scoring at least ``relative`` x the best and ``floor``."""

    top_k: int
    relative: float = 0.0
    floor: float = 0.0

    def build(self, build: Callable[..., tuple[list[Document], int]]) -> Callable[..., tuple[list[Document], int]]:
        """``build`` (``evaluate``'s document builder) followed by retrieval: returns the kept candidates,
        best first, and the gold passage's slot among them (-1: not retrieved; the row's ``gold_slot``). A
        question retrieving nothing is asked with no documents."""
        def retrieved(examples, index, n_docs, position, seed):
            docs, gold = build(examples, index, n_docs, position, seed)
            hits = above_cutoff(rank(_texts(docs), examples[index].question, self.top_k), self.relative, self.floor)
            kept = [i for i, _ in hits]
            return [docs[i] for i in kept], kept.index(gold) if gold in kept else -1
        return retrieved


def recall_at(examples, n: int, start: int, n_docs: int, positions: list[str], seed: int,
              build: Callable[..., tuple[list[Document], int]], kept_by: Retrieve | None = None,
              ks: tuple[int, ...] = RECALL_KS) -> dict:
    """``{"recall@k": fraction of questions start..n-1 whose gold passage ranks within k, ..., "n": count}``
    over each question's ``n_docs`` candidates (``build``'s, at each gold position; BM25 ignores order); with
    ``kept_by`` also ``"kept"`` (documents linked per question, mean) and ``"gold_kept"`` (fraction of
    questions whose gold passage is among them) after its top_k and cut-off."""
    from training.eval import position_for

    ranks, kept, gold_kept = [], 0, 0
    for layout in positions:
        for i in range(start, n):
            docs, gold = build(examples, i, n_docs, position_for(layout, i), seed)
            ranked = rank(_texts(docs), examples[i].question)
            ranks.append(next((r for r, (j, _) in enumerate(ranked, 1) if j == gold), None))
            if kept_by is not None:
                hits = above_cutoff(ranked[: kept_by.top_k], kept_by.relative, kept_by.floor)
                kept += len(hits)
                gold_kept += gold in [j for j, _ in hits]
    total = max(len(ranks), 1)
    out = {**{f"recall@{k}": sum(r is not None and r <= k for r in ranks) / total for k in ks}, "n": len(ranks)}
    if kept_by is not None:
        out.update(kept=kept / total, gold_kept=gold_kept / total)
    return out

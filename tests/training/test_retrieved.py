"""eval --retrieve: BM25 over each question's candidates, the cut-off, recall@k of the gold passage."""

from __future__ import annotations

from evaluation.nq import NQExample, build_documents
from kvlink_rag.types import Document
from training.retrieved import Retrieve, recall_at

EXAMPLES = [
    NQExample("who painted the mona lisa", ("Leonardo",), Document("The Mona Lisa was painted by Leonardo da Vinci.", "Mona Lisa")),
    NQExample("what is the capital of peru", ("Lima",), Document("Lima is the capital of Peru, on the Pacific coast.", "Peru")),
    NQExample("how tall is mount everest", ("8,849",), Document("Mount Everest is 8,849 metres tall.", "Everest")),
    NQExample("when did the titanic sink", ("1912",), Document("The Titanic sank in April 1912 after striking an iceberg.", "Titanic")),
    NQExample("who wrote hamlet", ("Shakespeare",), Document("Hamlet is a tragedy written by William Shakespeare.", "Hamlet")),
    NQExample("what colour is the mona lisa's dress", ("dark",), Document("Painters of Peru and Lima: a painted coast, "
                                                                       "the capital painted by a painter.", "Painters")),
]


def test_retrieve_keeps_the_top_k_then_the_cutoff_and_says_where_the_gold_passage_went():
    docs, gold = build_documents(EXAMPLES, 1, 4, "last")
    kept, slot = Retrieve(3).build(build_documents)(EXAMPLES, 1, 4, "last", 0)
    assert gold == 3 and kept[0] == EXAMPLES[1].gold and slot == 0 and len(kept) <= 3
    alone, slot = Retrieve(3, relative=0.9).build(build_documents)(EXAMPLES, 1, 4, "last", 0)
    assert alone == [EXAMPLES[1].gold] and slot == 0
    none, slot = Retrieve(3, floor=1e9).build(build_documents)(EXAMPLES, 1, 4, "last", 0)
    assert none == [] and slot == -1  # nothing retrieved: asked without documents


def test_recall_at_k_counts_the_gold_passages_rank_among_the_candidates():
    out = recall_at(EXAMPLES, 5, 0, 4, ["random"], 0, build_documents, Retrieve(1))
    assert out["n"] == 5 and out["recall@1"] == out["recall@10"] == 1.0  # each gold passage shares its words
    assert out["kept"] == 1.0 and out["gold_kept"] == 1.0
    assert set(out) == {"recall@1", "recall@3", "recall@5", "recall@10", "n", "kept", "gold_kept"}

"""BM25 retrieval's cut-off: documents a question barely touches are not retrieved beside the right one."""

from __future__ import annotations

from dataclasses import dataclass

from four_documents import DOCUMENTS, QUESTIONS
from service.retrieval import Retrieval, above_cutoff


@dataclass
class _Record:
    doc_id: str


class _Index:
    def __init__(self, docs):
        self.docs = docs

    def records(self, tenant):
        return [_Record(i) for i in self.docs]


class _Texts:
    def __init__(self, docs):
        self.docs = docs

    def get_intact(self, tenant, doc_id):
        return {"title": "", "text": self.docs[doc_id]}


def _retrieval(docs=DOCUMENTS) -> Retrieval:
    return Retrieval(_Index(docs), _Texts(docs))


def test_the_cutoff_keeps_scores_near_the_best_and_above_the_floor():
    hits = [("a", 2.0), ("b", 1.2), ("c", 0.9), ("d", 0.1)]
    assert above_cutoff(hits, 0.5, 0.0) == hits[:2]
    assert above_cutoff(hits, 0.0, 0.0) == hits and above_cutoff(hits, 0.0, 1.0) == hits[:2]
    assert above_cutoff([], 0.5, 0.0) == [] and above_cutoff(hits, 1.0, 0.0) == hits[:1]


def test_the_long_handbook_comes_second_yet_the_cutoff_leaves_the_right_document_alone():
    r = _retrieval()
    seconds = []
    for question, right in QUESTIONS.items():
        hits = r.search("t", question, 3)
        assert hits[0][0] == right, question
        seconds.append(hits[1][0] if len(hits) > 1 else None)
        assert [d for d, _ in above_cutoff(hits, 0.5, 0.0)] == [right], (question, hits)
    assert seconds.count("employee-handbook") == 5  # the shape: the handbook second in 5 of 6


def test_greetings_share_no_word_with_documents():
    r = _retrieval()
    for greeting in ("Hello, who are you?", "Hi there!", "What can you do for me?", "Thanks!"):
        assert r.search("t", greeting, 3) == [], greeting

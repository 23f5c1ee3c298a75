"""BM25 retrieval's cut-off: documents a question barely touches are not retrieved beside the right one."""

from __future__ import annotations

from dataclasses import dataclass

from four_documents import DOCUMENTS, QUESTIONS
from kvlink_rag.text.chunking import Chunker
from kvlink_rag.types import Document
from service.retrieval import BM25Params, Retrieval, above_cutoff, rank


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


def _retrieval(docs=DOCUMENTS, **kw) -> Retrieval:
    return Retrieval(_Index(docs), _Texts(docs), **kw)


def _chunker(chunk_tokens: int = 512) -> Chunker:
    """The engine's chunker over a stand-in token count (1.35 tokens a word, 10 of framing): 13 chunks of
    the handbook, as the default model's tokenizer gives at 512 tokens."""
    return Chunker(lambda text, title: int(len(text.split()) * 1.35) + 10, chunk_tokens)


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
        assert [h.doc_id for h in above_cutoff(hits, 0.5, 0.0)] == [right], (question, hits)
        assert all(h.chunk is None for h in hits)  # no chunker: whole documents
    assert seconds.count("employee-handbook") == 5  # the shape: the handbook second in 5 of 6


def test_greetings_share_no_word_with_documents():
    r = _retrieval()
    for greeting in ("Hello, who are you?", "Hi there!", "What can you do for me?", "Thanks!"):
        assert r.search("t", greeting, 3) == [], greeting


def test_a_chunked_handbook_is_retrieved_chunk_by_chunk_and_the_others_alone():
    chunks = _chunker()
    r = _retrieval(chunks=chunks)
    handbook = Document(DOCUMENTS["employee-handbook"])
    pieces = chunks(handbook)
    assert len(pieces) == 13 and [p.chunk for p in pieces] == list(range(13))
    for question, right in QUESTIONS.items():
        kept = above_cutoff(r.search("t", question, 3), 0.5, 0.0)
        assert [(h.doc_id, h.chunk) for h in kept] == [(right, None)], (question, kept)
    hits = r.search("t", "How many days of annual leave do I get per year?", 3)
    assert {h.doc_id for h in hits} == {"employee-handbook"} and len({h.chunk for h in hits}) == 3
    assert all("Annual leave is 25 days" in pieces[h.chunk].text for h in hits)
    assert r.chunk_of(handbook, hits[0].chunk) == pieces[hits[0].chunk]
    assert r.chunk_of(Document(DOCUMENTS["storage-faq"]), 0) is None  # not chunked: no chunk 0
    assert r.chunk_of(handbook, 13) is None


def test_use_chunks_rebuilds_the_index():
    r = _retrieval()
    question = "How many days of annual leave do I get per year?"
    whole = r.search("t", question, 1)
    assert [(h.doc_id, h.chunk) for h in whole] == [("employee-handbook", None)]
    r.use_chunks(_chunker())
    assert r.search("t", question, 1)[0].chunk is not None


def test_length_normalisation_b_keeps_a_long_document_from_winning_by_size():
    short = "the warranty covers the boiler and the pump for two years"
    long_ = " ".join(["the office has a boiler room in the basement"] + ["staff meet on monday"] * 60)
    texts = [long_, short]
    question = "what does the warranty of the boiler cover"
    flat, normalised = rank(texts, question, params=BM25Params(b=0.0)), rank(texts, question)
    assert normalised[0][0] == 1 and dict(normalised)[1] > 2 * dict(normalised)[0]
    assert dict(flat)[0] > dict(normalised)[0]  # without b the long document keeps more of its score
    assert BM25Params() == BM25Params(k1=1.5, b=0.75)

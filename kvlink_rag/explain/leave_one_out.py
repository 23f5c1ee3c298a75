"""Leave-one-document-out attribution: how much less likely the answer is without each document.

ContextCite (Cohen-Wang et al., 2024, arXiv 2409.00729) attributes an answer to the context by ablating
parts of it and measuring the drop in the answer's log-likelihood; its simplest ablation leaves one source
out. Linked caches make that cheap: the documents' KV is stored, so "without document i" is one more link
forward (:func:`kvlink_rag.linking.linker.link`) over the other documents' caches, re-rotated at their new
offsets, with their link tokens, the question and the answer as new tokens; no document is re-encoded.
A question over N documents costs N + 1 such forwards (the full set once, each ablation once), each over
``(N - 1) K + question + answer`` new tokens.

The score of document i is ``log p(answer | all documents) - log p(answer | all but i)`` in nats (summed
over the answer's tokens); a positive score means the document made the answer more likely. Shares are the
positive scores normalised to sum to 1 (all 0 when no document helps), so they read like the attention
shares of :mod:`kvlink_rag.explain.attribution`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..engine import Engine
from ..linking.linker import link
from ..model.lora import adapter_scope
from ..settings import ATTRIBUTION_METHODS
from ..types import Document, DocumentKV, LayeredDocuments
from .attribution import Attribution, DocumentAttribution


@dataclass
class LeaveOneOut:
    """Leave-one-document-out scores of one answer.

    Attributes:
        log_likelihood: ``log p(answer | all documents)`` in nats, summed over the answer's tokens.
        drops: per document (request order), the log-likelihood lost when it is left out (nats; may be < 0).
        shares: per document, ``max(drop, 0)`` over the sum of positive drops (0..1; all 0 if none is positive).
        answer_tokens: the number of answer tokens scored.
    """

    log_likelihood: float
    drops: list[float]
    shares: list[float]
    answer_tokens: int


def answer_log_likelihood(engine: Engine, kvs: list[DocumentKV], question_ids: torch.Tensor,
                          answer_ids: torch.Tensor, k: int | None = None, retention: float = 1.0) -> float:
    """``log p(answer | prefix, kvs linked, question)`` in nats: one link forward with the answer's tokens
    after the question (teacher forcing).

    Args:
        kvs: stored document caches in slot order (at least one).
        question_ids: ``[question_tokens]`` int64; answer_ids: ``[answer_tokens]`` int64, at least one.
        k: link tokens per document (None: the loaded K, 0: none); retention: fraction of each document kept.
    Raises:
        ValueError, ContextTooLong: as :func:`kvlink_rag.linking.linker.link`.
    """
    n = int(answer_ids.numel())
    embeds = None
    if engine.link_tokens is not None and (k is None or k > 0):
        embeds = engine.link_tokens.embeds[..., : (k or engine.link_tokens.k), :]
    source = LayeredDocuments.from_documents(kvs, retention) if retention < 1.0 else kvs
    new_ids = torch.cat([question_ids, answer_ids[:-1]])  # the last answer token predicts nothing scored
    with torch.inference_mode(), adapter_scope(engine.lm, engine.adapter):
        ctx = link(engine.lm, engine.prefix, source, embeds, new_ids, anchored=engine.anchored,
                   logits_to_keep=n)
    logits = ctx.logits if ctx.logits is not None else ctx.last_logits[None]  # [n, vocab]
    return -float(F.cross_entropy(logits[-n:].float().cpu(), answer_ids.cpu(), reduction="sum"))


def leave_one_out(engine: Engine, question: str, docs: list[Document], answer_ids: list[int] | torch.Tensor,
                  k: int | None = None, retention: float | None = None) -> LeaveOneOut:
    """Leave-one-document-out attribution of ``answer_ids`` (e.g. :attr:`Answer.token_ids`) over ``docs``.

    A chunked document (:meth:`Engine.chunks`) is left out with all its chunks. With one document its drop
    is against the question alone linked to nothing, which :func:`link` cannot do: its share is 1 by
    definition and its drop 0.

    Args:
        answer_ids: the answer's token ids (stop token excluded); an empty answer scores the stop token.
        k, retention: as :meth:`Engine.link_context` (the answer's own settings).
    Raises:
        ValueError: no documents, empty question, retention outside (0, 1];
        ContextTooLong: as :func:`kvlink_rag.linking.linker.link`.
    """
    if not docs:
        raise ValueError("at least one document is required")
    r = engine.retention(retention)
    ids = torch.as_tensor(list(answer_ids) or engine.stop_ids[:1], dtype=torch.long)
    q_ids = engine.template.question_ids(engine.lm.tokenizer, question)
    slots = [[engine.get_or_encode(c)[0] for c in engine.chunks(d)] for d in docs]  # per document, its slots
    full = answer_log_likelihood(engine, [kv for s in slots for kv in s], q_ids, ids, k, r)
    if len(docs) == 1:
        return LeaveOneOut(full, [0.0], [1.0], int(ids.numel()))
    drops = []
    for i in range(len(docs)):
        rest = [kv for j, s in enumerate(slots) if j != i for kv in s]
        drops.append(full - answer_log_likelihood(engine, rest, q_ids, ids, k, r))
    pos = [max(d, 0.0) for d in drops]
    total = sum(pos)
    return LeaveOneOut(full, drops, [p / total if total > 0 else 0.0 for p in pos], int(ids.numel()))


METHODS = ATTRIBUTION_METHODS  # the default first


def with_leave_one_out(att_json: dict, loo: LeaveOneOut) -> dict:
    """An :func:`kvlink_rag.explain.answers.attribution_json` body whose document shares are ``loo``'s, each document
    also carrying its ``log_likelihood_drop`` (nats) and the body ``method: "leave_one_out"`` and
    ``answer_log_likelihood``; passages and the prefix share stay the attention's.

    Raises:
        ValueError: ``loo`` has another number of documents than ``att_json``.
    """
    docs = att_json["documents"]
    if len(docs) != len(loo.shares):
        raise ValueError(f"{len(loo.shares)} leave-one-out scores for {len(docs)} documents")
    out = {**att_json, "method": "leave_one_out", "answer_log_likelihood": round(loo.log_likelihood, 6),
           "documents": [{**d, "share": round(s, 6), "log_likelihood_drop": round(drop, 6)}
                         for d, s, drop in zip(docs, loo.shares, loo.drops)]}
    return out


def apply_leave_one_out(att: Attribution, loo: LeaveOneOut) -> Attribution:
    """``att`` (the attention's, for token masses and passages) with ``loo``'s document shares.

    Raises:
        ValueError: other numbers of documents.
    """
    if len(att.documents) != len(loo.shares):
        raise ValueError(f"{len(loo.shares)} leave-one-out scores for {len(att.documents)} documents")
    return Attribution(att.prefix, [DocumentAttribution(s, d.token_mass, d.passages)
                                    for d, s in zip(att.documents, loo.shares)])

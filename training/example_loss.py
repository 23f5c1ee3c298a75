"""One training example's loss under the linked layout, and documents encoded with the training adapter on
(``doc_side``; :mod:`kvlink_rag.reuse.doc_side`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from evaluation.nq import NQExample
from kvlink_rag.engine import Engine
from kvlink_rag.linking.chunk_past import chunk_walk
from kvlink_rag.linking.linker import link
from kvlink_rag.model.loader import LoadedModel
from kvlink_rag.reuse.doc_side import encode_batch_with_adapter, encode_with_adapter
from kvlink_rag.text.chunking import chunks_before
from kvlink_rag.types import Document, DocumentKV

from .data import answer_ids
from .train_config import TRAIN_ADAPTER, TrainConfig


def example_loss(engine: Engine, link_embeds: torch.Tensor, ex: NQExample, docs, cfg: TrainConfig,
                 lm: LoadedModel | None = None) -> torch.Tensor:
    """Mean cross-entropy (nats/token) of the first gold answer (+ end token) under the linked layout, the
    link-and-question forward on ``lm`` (default ``engine.lm``; documents always come from ``engine``);
    with ``cfg.doc_side`` the documents are encoded now with the training adapter on (graph kept)."""
    if cfg.doc_side:
        kvs = doc_side_kvs(engine, docs)
    else:
        kvs = [engine.get_or_encode(d)[0] for d in docs]
    q_ids = engine.template.question_ids(engine.lm.tokenizer, ex.question)
    a_ids = answer_ids(engine, ex.answers[0], cfg.max_answer_tokens)
    ctx = link(lm or engine.lm, engine.prefix, kvs, link_embeds, torch.cat([q_ids, a_ids[:-1]]),
               anchored=engine.anchored, logits_to_keep=len(a_ids), joined=engine.joins(docs))
    return F.cross_entropy(ctx.logits.float(), a_ids.to(ctx.logits.device))


def doc_side_kvs(engine: Engine, docs: list[Document]) -> list[DocumentKV]:
    """``docs`` encoded now with the training adapter on (graph kept): in one batched forward, except chunks
    encoded in context (``Document.context``), each encoded as the engine encodes it: after the text of the chunks
    before it, or (``chunk_context_from`` 'cache') after the caches of every chunk before it, encoded here with the
    adapter on too (those in ``docs`` once; a chunk's loss reaches the adapter through its own forward, the earlier
    chunks' caches enter it detached).

    Raises:
        ValueError: a chunk from ``chunk_context_from`` 'cache' not made by the engine's chunker (no chain).
    """
    prefix = engine.prefix if engine.anchored else None
    kw = dict(kv_dtype=engine.settings.kv_dtype, fingerprint="doc-side-training")
    alone = [i for i, d in enumerate(docs) if d.context is None]
    kvs = dict(zip(alone, encode_batch_with_adapter(engine.lm, [engine.document_ids(docs[i]) for i in alone],
                                                    TRAIN_ADAPTER, prefix=prefix, **kw) if alone else []))
    done = {docs[i]: kv for i, kv in kvs.items()}
    with chunk_walk():  # one walk for all: a document's chunks among docs continue one past
        for i, d in enumerate(docs):
            if d.context is None:
                continue
            if engine.settings.chunk_context_from == "cache":
                chain = [*chunks_before(d), d]  # in order, each chunk after the caches of those before it
                for j, c in enumerate(chain):
                    if c not in done:  # the first chunk's past is the anchor prefix alone (past_prefix of nothing)
                        past = engine.past(c, [done[p] for p in chain[:j]])
                        done[c] = encode_with_adapter(engine.lm, engine.document_ids(c), TRAIN_ADAPTER, prefix=past,
                                                      **kw)
                kvs[i] = done[d]
            else:
                kvs[i] = encode_with_adapter(engine.lm, engine.document_ids(d), TRAIN_ADAPTER, prefix=prefix,
                                             context=engine.context_ids(d), **kw)
    return [kvs[i] for i in range(len(docs))]

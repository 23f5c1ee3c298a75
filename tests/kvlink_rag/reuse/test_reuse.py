"""Reuse methods behind one interface: the request's recompute ratio picks one; each is its function."""

from __future__ import annotations

import torch

from factories import random_ids, tiny_model
from kvlink_rag.linking.document_prefill import encode_document, encode_prefix
from kvlink_rag.linking.linker import link
from kvlink_rag.reuse.blend import blend
from kvlink_rag.reuse.methods import METHODS, CacheBlend, LinkTokens, ReuseInputs, reuse_method


def _inputs(lm) -> ReuseInputs:
    prefix = encode_prefix(lm, random_ids(4, 9))
    ids = [random_ids(n, seed=n) for n in (12, 7)]
    docs = [encode_document(lm, i, kv_dtype="float32", prefix=prefix) for i in ids]
    links = torch.randn(3, lm.config.hidden_size, generator=torch.Generator().manual_seed(1)) * 0.02
    return ReuseInputs(lm, prefix, docs, ids, links, random_ids(5, 3), anchored=True)


def test_the_recompute_ratio_picks_the_method():
    assert isinstance(reuse_method(0.0), LinkTokens)
    assert reuse_method(0.3) == CacheBlend(0.3)
    assert set(METHODS) == {"link-tokens", "cacheblend"}


@torch.inference_mode()
def test_each_method_is_its_function():
    lm = tiny_model("llama")
    x = _inputs(lm)
    got = LinkTokens().context(x).last_logits
    ref = link(lm, x.prefix, x.docs, x.link_embeds, x.question_ids, anchored=True, new_tokens=1).last_logits
    assert torch.equal(got, ref)
    got = CacheBlend(0.5).context(x).last_logits
    ref = blend(lm, x.prefix, x.docs, x.doc_ids, x.link_embeds, x.question_ids, recompute_ratio=0.5,
                new_tokens=1).last_logits
    assert torch.equal(got, ref)

"""The same computations on a CUDA device as on the CPU (skipped without one).

The CPU path is checked against transformers' own forward under the KVLink masks in test_linker_exact,
test_retention and test_ragged; here every piece of it runs again with the model on ``cuda`` (float32,
TF32 off, so the only differences are reduction order) and must agree with the CPU result, and the CUDA
linked cache must agree with transformers' reference forward run on CUDA.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from factories import random_ids, tiny_model
from kvlink_rag.decoding.generate import SamplingParams, decode, full_prefill
from kvlink_rag.linking.document_prefill import encode_document, encode_prefix
from kvlink_rag.linking.kvcache import cache_tensors
from kvlink_rag.linking.linker import link
from kvlink_rag.model.loader import wrap_model
from kvlink_rag.runtime.model_runner import forward_ragged
from kvlink_rag.runtime.ragged import KVChunk, RaggedBatch, SequenceKV
from kvlink_rag.types import LayeredDocuments
from reference import Piece, kv_by_position, reference_forward

DEV = os.environ.get("KVLINK_RAG_TEST_DEVICE", "cuda")  # "cpu" checks these tests themselves without a GPU
pytestmark = pytest.mark.skipif(DEV == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device")
TOL = 1e-4
DOC_LENS, PREFIX_LEN, QUESTION_LEN, K = (13, 29, 7), 11, 6, 3


def _pair(family: str):
    """The same tiny random model on the CPU and on CUDA."""
    torch.backends.cuda.matmul.allow_tf32 = False
    cpu = tiny_model(family)
    gpu = wrap_model(copy.deepcopy(cpu.model).to(DEV), None, cpu.fingerprint)
    return cpu, gpu


def _linked(lm, anchored: bool, retention: float = 1.0):
    """A 3-document linked context with K link tokens; inputs are made on the CPU (as the service does)."""
    prefix = encode_prefix(lm, random_ids(PREFIX_LEN, 1))
    docs = [encode_document(lm, random_ids(n, 10 + i), kv_dtype="float32", prefix=prefix if anchored else None)
            for i, n in enumerate(DOC_LENS)]
    torch.manual_seed(5)
    link_embeds = torch.randn(K, lm.config.hidden_size) * 0.02
    layered = LayeredDocuments.from_documents(docs, retention=retention)
    return link(lm, prefix, layered, link_embeds, random_ids(QUESTION_LEN, 99), anchored=anchored), docs


def _close(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().float().cpu() - b.detach().float().cpu()).abs().max().item()


@pytest.mark.parametrize("family", ["llama", "qwen3", "llama3", "mistral"])
@pytest.mark.parametrize("anchored", [False, True], ids=["isolated", "anchored"])
def test_linked_cache_and_logits_on_cuda_equal_the_cpu(family, anchored):
    cpu, gpu = _pair(family)
    c_ctx, c_docs = _linked(cpu, anchored)
    g_ctx, g_docs = _linked(gpu, anchored)
    for c, g in zip(c_docs, g_docs):  # the stored (position-free) document caches
        assert _close(c.keys, g.keys) < TOL and _close(c.values, g.values) < TOL
    assert _close(c_ctx.last_logits, g_ctx.last_logits) < TOL
    (ck, cv), (gk, gv) = cache_tensors(c_ctx.cache), cache_tensors(g_ctx.cache)
    assert _close(ck, gk) < TOL and _close(cv, gv) < TOL
    params = SamplingParams(max_new_tokens=6)
    assert list(decode(cpu, c_ctx, params)) == list(decode(gpu, g_ctx, params))


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_cuda_linked_cache_equals_transformers_reference_on_cuda(family):
    _, gpu = _pair(family)
    ctx, _ = _linked(gpu, anchored=False)
    ids = [random_ids(PREFIX_LEN, 1)] + [random_ids(n, 10 + i) for i, n in enumerate(DOC_LENS)]
    torch.manual_seed(5)
    link_embeds = (torch.randn(K, gpu.config.hidden_size) * 0.02).to(DEV)
    pieces, pos = [Piece("prefix", torch.arange(PREFIX_LEN, device=DEV), ids=ids[0].to(DEV))], PREFIX_LEN
    for doc in ids[1:]:
        pieces.append(Piece("document", torch.arange(pos, pos + len(doc), device=DEV), ids=doc.to(DEV)))
        pieces.append(Piece("link", torch.arange(pos + len(doc), pos + len(doc) + K, device=DEV), embeds=link_embeds))
        pos += len(doc) + K
    pieces.append(Piece("question", torch.arange(pos, pos + QUESTION_LEN, device=DEV),
                        ids=random_ids(QUESTION_LEN, 99).to(DEV)))
    ref_logits, ref_k, ref_v, ref_pos = reference_forward(gpu, pieces)
    assert _close(ctx.last_logits, ref_logits[-1]) < TOL
    k, v = cache_tensors(ctx.cache)
    rk, rv = kv_by_position(ref_k.cpu(), ref_v.cpu(), ref_pos.cpu(), ctx.storage_positions.cpu())
    assert _close(k, rk) < TOL and _close(v, rv) < TOL


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_partial_retention_on_cuda_equals_the_cpu(family):
    cpu, gpu = _pair(family)
    c_ctx, _ = _linked(cpu, anchored=True, retention=0.5)
    g_ctx, _ = _linked(gpu, anchored=True, retention=0.5)
    assert torch.equal(c_ctx.storage_positions.cpu(), g_ctx.storage_positions.cpu())
    assert _close(c_ctx.last_logits, g_ctx.last_logits) < TOL


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_full_prefill_on_cuda_equals_the_cpu(family):
    cpu, gpu = _pair(family)
    ids = random_ids(40, 3)
    assert _close(full_prefill(cpu, ids).last_logits, full_prefill(gpu, ids).last_logits) < TOL


@torch.inference_mode()
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_ragged_batch_on_cuda_equals_the_cpu(family):
    cpu, gpu = _pair(family)
    got = []
    for lm, dev in ((cpu, "cpu"), (gpu, DEV)):
        cfg, batch, embeds, positions = lm.config, RaggedBatch(), [], []
        for n, new, split in ((9, 1, None), (23, 6, 10), (14, 3, 5)):
            prompt = random_ids(n, seed=n).to(dev)
            out = lm.model(input_ids=prompt[None], position_ids=torch.arange(n, device=dev)[None], use_cache=True)
            k, v = cache_tensors(out.cache)
            chunks = [KVChunk(k[:, :, :split], v[:, :, :split])] if split else []
            seq = SequenceKV(chunks, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, torch.float32,
                             dev, 4)
            seq.append(k[:, :, split or 0:], v[:, :, split or 0:])
            batch.add(seq, new)
            embeds.append(lm.embed_tokens(random_ids(new, seed=new).to(dev)))
            positions.append(torch.arange(n, n + new, device=dev))
        got.append(forward_ragged(lm, batch, torch.cat(embeds), torch.cat(positions)))
    for c, g in zip(*got):
        assert _close(c, g) < TOL

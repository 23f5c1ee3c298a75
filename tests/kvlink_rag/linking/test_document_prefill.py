"""encode_document: shapes, dtypes, fingerprints and bad input."""

import pytest
import torch

from factories import random_ids, tiny_model
from kvlink_rag.linking.document_prefill import encode_document, encode_prefix, encoding_fingerprint


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_shapes_and_dtypes(dtype):
    lm = tiny_model("qwen3")
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    kv = encode_document(lm, random_ids(19, 0), kv_dtype=name)
    assert kv.keys.shape == (2, 2, 19, 64) and kv.values.shape == (2, 2, 19, 64)
    assert kv.keys.dtype == dtype and kv.values.dtype == dtype
    assert kv.token_ids.tolist() == random_ids(19, 0).tolist()
    assert kv.encoding == "isolated" and kv.nbytes == 2 * 2 * 2 * 19 * 64 * kv.keys.element_size()
    ref = encode_document(lm, random_ids(19, 0), kv_dtype="float32")
    assert (kv.keys.float() - ref.keys).abs().max() < 0.05  # rounding only


def test_same_ids_give_the_same_kv_bitwise():
    lm = tiny_model("llama")
    a = encode_document(lm, random_ids(31, 4), kv_dtype="float32")
    b = encode_document(lm, random_ids(31, 4), kv_dtype="float32")
    assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_fingerprint_depends_on_encoding_prefix_and_dtype():
    lm = tiny_model("llama")
    p1, p2 = encode_prefix(lm, random_ids(5, 1)), encode_prefix(lm, random_ids(5, 2))
    fps = {
        encoding_fingerprint("m", "isolated", None, "bfloat16"),
        encoding_fingerprint("m", "isolated", None, "float16"),
        encoding_fingerprint("m", "anchored", p1, "bfloat16"),
        encoding_fingerprint("m", "anchored", p2, "bfloat16"),
        encoding_fingerprint("other", "isolated", None, "bfloat16"),
    }
    assert len(fps) == 5
    assert encoding_fingerprint("m", "isolated", p1, "bfloat16") == encoding_fingerprint("m", "isolated", p2, "bfloat16")


def test_bad_input_gives_clear_errors():
    lm = tiny_model("llama")
    with pytest.raises(ValueError, match="empty"):
        encode_document(lm, torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="exceeds the model's context of 2048"):
        encode_document(lm, random_ids(2049, 0))
    prefix = encode_prefix(lm, random_ids(10, 0))
    with pytest.raises(ValueError, match="10-token prefix"):
        encode_document(lm, random_ids(2040, 0), prefix=prefix)
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):
        encode_document(lm, random_ids(5, 0), kv_dtype="int4")
    with pytest.raises(ValueError, match="unknown encoding"):
        encoding_fingerprint("m", "shuffled", None, "float32")
    with pytest.raises(ValueError, match="anchor prefix is empty"):
        encode_prefix(lm, torch.zeros(0, dtype=torch.long))


@pytest.mark.parametrize("anchored", [False, True], ids=["isolated", "anchored"])
def test_a_document_encoded_in_chunks_equals_one_forward_and_guards_each_chunk(monkeypatch, anchored):
    from contextlib import contextmanager

    from kvlink_rag.linking import document_prefill
    from kvlink_rag.linking.document_prefill import chunk_guard, encode_document, encode_prefix

    lm = tiny_model("llama")
    ids, prefix = random_ids(17, seed=3), (encode_prefix(lm, random_ids(4, seed=4)) if anchored else None)
    whole = encode_document(lm, ids, kv_dtype="float32", prefix=prefix, importance=True)
    monkeypatch.setattr(document_prefill, "CHUNK_TOKENS", 5)
    monkeypatch.setattr(document_prefill, "CHUNK_SECONDS", 0)  # fixed chunks (else resized by time)
    calls = []

    @contextmanager
    def guard():
        calls.append(1)
        yield

    token = chunk_guard.set(guard)
    try:
        chunked = encode_document(lm, ids, kv_dtype="float32", prefix=prefix, importance=True)
    finally:
        chunk_guard.reset(token)
    assert len(calls) == 4  # 4 chunks of 5, 5, 5, 2 tokens, each inside the guard
    assert torch.allclose(chunked.keys, whole.keys, atol=1e-5) and torch.allclose(chunked.values, whole.values, atol=1e-5)
    assert torch.allclose(chunked.importance, whole.importance, atol=1e-4)


def test_chunks_are_resized_toward_the_target_time():
    from kvlink_rag.linking.document_prefill import CHUNK_SECONDS, _next_chunk

    assert _next_chunk(64, 2 * CHUNK_SECONDS) == 32 and _next_chunk(64, CHUNK_SECONDS / 2) == 128
    assert _next_chunk(64, 100.0) == 16 and _next_chunk(64, 0.0) == 512  # bounds


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("anchored", [0, 4, 24], ids=["isolated", "anchored", "after-a-long-past"])
@pytest.mark.parametrize("chunk", [0, 5], ids=["whole", "chunked"])
def test_the_runner_encodes_what_transformers_encodes(monkeypatch, family, anchored, chunk):
    """The bfloat16 formats encode documents on the model runner: K, V and importance equal transformers'
    eager forward (the reference) in float32, whole or in chunks, isolated or after the anchor prefix - or after a
    prefix longer than the document (a chunk after the chunks before it: the importance mass from the fused
    kernel's log-sum-exp, :func:`kvlink_rag.runtime.attention_probs.attention_mass` with ``first_key``)."""
    from contextlib import nullcontext

    from kvlink_rag.linking import document_prefill
    from kvlink_rag.linking.document_prefill import chunk_guard

    lm = tiny_model(family)
    ids, prefix = random_ids(17, seed=3), (encode_prefix(lm, random_ids(anchored, seed=4)) if anchored else None)
    want = encode_document(lm, ids, kv_dtype="float32", prefix=prefix, importance=True)
    monkeypatch.setattr(document_prefill, "on_runner", lambda lm: True)  # native weights on the runner
    monkeypatch.setattr(document_prefill, "CHUNK_TOKENS", chunk)
    monkeypatch.setattr(document_prefill, "CHUNK_SECONDS", 0)
    token = chunk_guard.set(nullcontext if chunk else None)
    try:
        got = encode_document(lm, ids, kv_dtype="float32", prefix=prefix, importance=True)
    finally:
        chunk_guard.reset(token)
    assert (got.keys - want.keys).abs().max() < 1e-4 and (got.values - want.values).abs().max() < 1e-4
    assert (got.importance - want.importance).abs().max() < 1e-4
    assert got.importance.sum() > 0


@pytest.mark.parametrize("fmt", ["int4-bf16", "q4q8-f32", "int4-f32"])
def test_the_runners_formats_encode_on_the_runner_and_native_on_transformers(fmt):
    """The formats that prefill in bfloat16 and those that prefill with the model's float32 weights (CPUs without
    native bfloat16: transformers' eager attention made importance scores 3.7x the encode there)."""
    from kvlink_rag.linking.document_prefill import on_runner

    lm = tiny_model("llama")
    assert not on_runner(lm)  # native
    lm.weight_format = fmt
    try:
        assert on_runner(lm)
        with torch.enable_grad():
            assert on_runner(lm)  # no input asks for a gradient
    finally:
        lm.weight_format = "native"


@pytest.mark.parametrize("anchored", [False, True], ids=["isolated", "anchored"])
@pytest.mark.parametrize("runner", [False, True], ids=["transformers", "runner"])
def test_a_document_encoded_after_a_context_is_the_tail_of_both_encoded_as_one(monkeypatch, anchored, runner):
    """A chunk encoded in context (the chunk before it): K (before RoPE), V and importance equal the last
    slots of the two encoded as one document, on transformers' forward and on the runner; the context's own
    KV is not returned."""
    from kvlink_rag.linking import document_prefill

    lm = tiny_model("llama")
    ctx, ids = random_ids(9, seed=5), random_ids(13, seed=6)
    prefix = encode_prefix(lm, random_ids(4, seed=4)) if anchored else None
    joint = encode_document(lm, torch.cat([ctx, ids]), kv_dtype="float32", prefix=prefix, importance=True)
    monkeypatch.setattr(document_prefill, "on_runner", lambda lm: runner)
    got = encode_document(lm, ids, kv_dtype="float32", prefix=prefix, importance=True, context=ctx)
    alone = encode_document(lm, ids, kv_dtype="float32", prefix=prefix, importance=True)
    assert got.keys.shape == (2, 2, 13, 64) and got.token_ids.tolist() == ids.tolist()
    assert (got.keys - joint.keys[:, :, 9:]).abs().max() < 1e-4
    assert (got.values - joint.values[:, :, 9:]).abs().max() < 1e-4
    assert (got.importance - joint.importance[9:]).abs().max() < 1e-4
    assert (got.values - alone.values).abs().max() > 1e-2  # the context changed the values


def test_a_context_too_long_for_the_model_keeps_its_last_ids():
    lm = tiny_model("llama")  # 2,048 positions
    ctx, ids = random_ids(100, seed=7), random_ids(2000, seed=8)
    got = encode_document(lm, ids, kv_dtype="float32", context=ctx)
    want = encode_document(lm, ids, kv_dtype="float32", context=ctx[-48:])
    assert torch.equal(got.values, want.values) and got.num_tokens == 2000

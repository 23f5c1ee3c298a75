"""End to end on the real default model (SmolLM2-135M-Instruct): exactness once, tokenisation, reuse."""

from __future__ import annotations

import pytest
import torch

from factories import NQ_PATH, real_engine
from evaluation.nq import build_documents, load_nq
from kvlink_rag.linking.kvcache import cache_tensors
from kvlink_rag.linking.linker import link
from kvlink_rag.types import ContextTooLong, Document
from reference import Piece, kv_by_position, reference_forward

pytestmark = pytest.mark.e2e
SEEDS_DIR = NQ_PATH.parents[1] / "seeds"


def _nq_docs(n: int, index: int = 3):
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    examples = load_nq(NQ_PATH, limit=60)
    docs, _ = build_documents(examples, index, n, "middle")
    return examples[index], docs


def test_real_model_linked_cache_matches_reference_under_kvlink_mask(tmp_path):
    eng = real_engine(tmp_path, kv_dtype="float32", encoding="isolated", link_k=3, shipped_links=False)
    ex, docs = _nq_docs(3)
    kvs = [eng.encode(d) for d in docs]
    q_ids = eng.template.question_ids(eng.lm.tokenizer, ex.question)
    embeds = eng.link_tokens.embeds
    with torch.inference_mode():
        ctx = link(eng.lm, eng.prefix, kvs, embeds, q_ids, anchored=False)
    pieces, pos = [Piece("prefix", torch.arange(eng.prefix.num_tokens), ids=eng.prefix.token_ids)], eng.prefix.num_tokens
    for kv in kvs:
        pieces.append(Piece("document", torch.arange(pos, pos + kv.num_tokens), ids=kv.token_ids))
        pos += kv.num_tokens
        pieces.append(Piece("link", torch.arange(pos, pos + 3), embeds=embeds))
        pos += 3
    pieces.append(Piece("question", torch.arange(pos, pos + len(q_ids)), ids=q_ids))
    with torch.inference_mode():
        ref_logits, ref_k, ref_v, ref_pos = reference_forward(eng.lm, pieces)
    logit_diff = (ctx.last_logits - ref_logits[-1]).abs().max().item()
    k, v = cache_tensors(ctx.cache)
    rk, rv = kv_by_position(ref_k, ref_v, ref_pos, ctx.storage_positions)
    print(f"real model: max |logit diff| {logit_diff:.2e}, |k diff| {(k - rk).abs().max():.2e}, "
          f"|v diff| {(v - rv).abs().max():.2e}")
    assert logit_diff < 1e-4
    assert (k - rk).abs().max().item() < 1e-4 and (v - rv).abs().max().item() < 1e-4


def test_anchored_single_document_k0_reproduces_full_prefill(tmp_path):
    """Anchored encoding puts the document exactly where full prefill has it: same logits, same answer."""
    eng = real_engine(tmp_path, kv_dtype="float32", encoding="anchored", link_k=0)
    ex, docs = _nq_docs(1)
    with torch.inference_mode():
        ctx, _ = eng.link_context(ex.question, docs)
        from kvlink_rag.decoding.generate import full_prefill
        ref = full_prefill(eng.lm, eng.prompt_ids(ex.question, docs))
    assert (ctx.last_logits - ref.last_logits).abs().max().item() < 1e-4
    assert eng.answer(ex.question, docs).token_ids == eng.answer_full(ex.question, docs).token_ids


def test_document_ids_are_the_same_alone_and_inside_any_layout(tmp_path):
    eng = real_engine(tmp_path)
    _, docs = _nq_docs(4)
    if SEEDS_DIR.exists():  # real Unicode (Chinese) documents
        docs += [Document(p.read_text(encoding="utf-8")[:1500], p.stem) for p in sorted(SEEDS_DIR.glob("*.txt"))[:2]]
    alone = [torch.cat([eng.document_ids(c) for c in eng.chunks(d)]) for d in docs]  # a long one: its chunks
    for order in (list(range(len(docs))), list(reversed(range(len(docs)))), [2, 0, 1]):
        layout = [docs[i] for i in order]
        ids = eng.prompt_ids("who wrote it?", layout)
        pos = eng.prefix.num_tokens
        for i in order:
            assert torch.equal(ids[pos:pos + len(alone[i])], alone[i])
            pos += len(alone[i])
    # and the ids decode back to the document text
    assert docs[0].text.strip() in eng.lm.tokenizer.decode(alone[0])


def test_second_query_reuses_every_cache_and_answers(tmp_path):
    eng = real_engine(tmp_path, link_k=5)
    ex, docs = _nq_docs(5)
    first = eng.answer(ex.question, docs, max_new_tokens=8)
    second = eng.answer(ex.question, docs, max_new_tokens=8)
    assert first.cache_hits == 0 and second.cache_hits == 5
    assert first.token_ids == second.token_ids and second.text
    assert second.context_tokens == eng.prompt_ids(ex.question, docs).numel() + 5 * 5


def test_engine_bad_input(tmp_path):
    eng = real_engine(tmp_path)
    with pytest.raises(ValueError, match="at least one document"):
        eng.answer("what?", [])
    with pytest.raises(ValueError, match="document text is empty"):
        eng.answer("what?", [Document("   ")])
    with pytest.raises(ValueError, match="question is empty"):
        eng.answer(" ", [Document("text")])
    with pytest.raises(ContextTooLong, match=r"document has 9003 tokens; the longest this model can answer over is "
                                             r"\d+ \(the model's context of 8192 positions"):
        eng.encode(Document("word " * 9000))


def test_default_engine_uses_the_shipped_trained_link_tokens_and_adapter(tmp_path):
    eng = real_engine(tmp_path)
    assert eng.link_tokens.metadata.get("trained") is True and eng.link_tokens.k == eng.settings.link_k
    assert eng.adapter is not None and eng.adapter in eng.lm.adapters
    untrained = real_engine(tmp_path, shipped_links=False)
    assert untrained.adapter is None and untrained.link_tokens.metadata.get("trained") is False
    other_k = real_engine(tmp_path, link_k=3)  # the shipped K=5 artifact does not fit K=3
    assert other_k.link_tokens.k == 3 and other_k.adapter is None


WARRANTY = Document("Warranty. The Model X kettle comes with a two-year limited warranty. The warranty covers defects "
                    "in materials and workmanship, including a faulty heating element, a broken thermostat and a "
                    "leaking base. If your kettle fails within two years of purchase, we repair or replace it free "
                    "of charge.")
FAQ = Document("Frequently asked questions. What is not covered? The warranty does not cover limescale build-up, "
               "damage from dropping the kettle, use with the wrong voltage, cosmetic scratches or commercial use. "
               "How do I make a claim? Email support with your receipt and a photo of the fault.")


def test_linked_answer_over_a_coverage_note_and_an_exclusions_faq_quotes_the_coverage(tmp_path):
    """Issue 17's newcomer case: "What does the warranty cover?" over a coverage note and an FAQ listing
    exclusions got the exclusions from linked reuse (and 'Fabric' with the 150-step link tokens); with the
    shipped ones the answer is taken from what the warranty covers, never from the exclusions."""
    engine = real_engine(tmp_path)
    answer = engine.answer("What does the warranty cover?", [WARRANTY, FAQ]).text.strip().lower()
    assert answer and answer.rstrip(".") in WARRANTY.text.lower()
    assert not any(x in answer for x in ("limescale", "dropping", "voltage", "scratches", "commercial"))


def test_the_bundled_lookup_adapter_is_offered_and_answers_lookups_the_default_misses(tmp_path):
    """``lookup`` (kvlink_rag/assets/adapters: the task-mixture artifact, trained on key-value retrieval among other
    tasks) is offered for the default model and, named per query, finds values the default artifact does not."""
    from kvlink_rag.adapter_registry import AdapterVariants
    from training.kv_retrieval import make_example

    variants = AdapterVariants(real_engine(tmp_path))
    assert variants.names() == ["default", "none", "lookup"]
    assert dict(variants.get("lookup").link_tokens.metadata["train_config"]["mixture"]["weights"])["kv"] == 0.5
    for i in (0, 4):
        ex = make_example(i, 3, seed=0)
        docs = [ex.gold, *ex.distractors]
        plain = variants.get("default").answer(ex.question, docs, max_new_tokens=40).text
        assert variants.get("lookup").answer(ex.question, docs, max_new_tokens=40).text == ex.answers[0] != plain

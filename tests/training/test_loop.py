"""Link-token training on a tiny random model: loss goes down, seeds reproduce, checkpoints resume."""

from __future__ import annotations

import pytest
import torch

from factories import tiny_text_engine
from evaluation.nq import NQExample
from kvlink_rag.types import Document
from training.data import Split
from training.loop import Trainer
from training.mixture import Mixture
from training.train_config import TrainConfig


def _split(n=12) -> Split:
    colours = ["red", "blue", "green", "black", "white", "pink", "gold", "grey", "brown", "cyan", "lime", "teal"]
    ex = [NQExample(f"what colour is thing {i}?", (colours[i % len(colours)],),
                    Document(f"Thing {i} is painted {colours[i % len(colours)]} all over.", f"Thing {i}"))
          for i in range(n)]
    return Split(train=ex[:-2], val=ex[-2:], data_hash="test")


def _cfg(**kw) -> TrainConfig:
    base = dict(steps=6, accumulate=2, k=2, docs=3, lr=1e-2, link_lr=5e-2, lora=True, rank=4, alpha=8,
                checkpoint_every=3, seed=0)
    base.update(kw)
    return TrainConfig(**base)


def _overfit_loss(trainer: Trainer) -> float:
    ex, docs = trainer.example(0)
    from kvlink_rag.model.lora import adapter_scope
    from training.example_loss import example_loss

    with torch.no_grad(), adapter_scope(trainer.engine.lm, trainer.adapter):
        return float(example_loss(trainer.engine, trainer.link_embeds, ex, docs, trainer.cfg))


def test_training_lowers_the_loss(tmp_path):
    trainer = Trainer(tiny_text_engine(tmp_path), _split(), _cfg(steps=12, accumulate=1), tmp_path / "ck")
    trainer.order = [0]  # one example over and over: the loss must fall
    before = _overfit_loss(trainer)
    trainer.run(val_every=0)
    after = _overfit_loss(trainer)
    assert after < before - 0.5, (before, after)


def test_link_only_training_changes_only_the_link_embeddings(tmp_path):
    engine = tiny_text_engine(tmp_path)
    weights = {n: p.clone() for n, p in engine.lm.model.named_parameters()}
    trainer = Trainer(engine, _split(), _cfg(lora=False, steps=2), tmp_path / "ck")
    start = trainer.link_embeds.detach().clone()
    trainer.run(val_every=0)
    assert not torch.equal(start, trainer.link_embeds.detach())
    assert all(torch.equal(p, weights[n]) for n, p in engine.lm.model.named_parameters())


def test_same_seed_same_result_and_resume_reaches_the_same_state(tmp_path):
    full = Trainer(tiny_text_engine(tmp_path), _split(), _cfg(), tmp_path / "a")
    full.run(val_every=0)
    again = Trainer(tiny_text_engine(tmp_path), _split(), _cfg(), tmp_path / "b")
    again.run(val_every=0)
    assert full.state.losses == again.state.losses
    assert torch.equal(full.link_embeds, again.link_embeds)

    # stop after 3 steps (a checkpoint), then resume in a fresh trainer with a fresh model
    part = Trainer(tiny_text_engine(tmp_path), _split(), _cfg(steps=3), tmp_path / "c")
    part.run(val_every=0)
    resumed = Trainer(tiny_text_engine(tmp_path), _split(), _cfg(), tmp_path / "c")
    assert resumed.state.step == 3
    resumed.run(val_every=0)
    assert resumed.state.losses == full.state.losses
    assert torch.allclose(resumed.link_embeds, full.link_embeds)
    for p, q in zip(resumed.params, full.params):
        assert torch.allclose(p, q)


def test_per_slot_link_tokens_train_every_slot_and_round_trip(tmp_path):
    from kvlink_rag.linking.link_tokens import load_link_tokens

    engine = tiny_text_engine(tmp_path)
    trainer = Trainer(engine, _split(), _cfg(lora=False, steps=2, slots=2, docs=3), tmp_path / "ck")
    start = trainer.link_embeds.detach().clone()
    assert start.shape == (2, 2, engine.lm.config.hidden_size) and torch.equal(start[0], start[1])
    trainer.run(val_every=0)
    moved = (trainer.link_embeds.detach() - start).abs().amax(dim=(1, 2))
    assert (moved > 0).all()  # slot 1 is trained too (slots 2.. reuse it)
    art = trainer.artifact({})
    art.save(tmp_path / "slots.safetensors")
    back = load_link_tokens(tmp_path / "slots.safetensors", engine.lm)
    assert back.slots == 2 and back.k == 2 and torch.equal(back.embeds, art.embeds)


def test_checkpoint_written_before_a_new_option_still_resumes(tmp_path):
    part = Trainer(tiny_text_engine(tmp_path), _split(), _cfg(steps=3), tmp_path / "c")
    part.run(val_every=0)
    ck = torch.load(part.checkpoint_path, weights_only=False)
    del ck["config"]["slots"]  # as written by a release without per-slot link tokens
    torch.save(ck, part.checkpoint_path)
    assert Trainer(tiny_text_engine(tmp_path), _split(), _cfg(), tmp_path / "c").state.step == 3


def test_a_question_whose_answer_is_in_every_passage_is_skipped(tmp_path):
    """NQ dev has "atlantic ocean's shape is similar to which english alphabet" -> "S": every passage holds
    an "s", so no distractor can be drawn; training skips it for the next question instead of stopping."""
    split = _split()
    odd = NQExample("which letter is the shape of the ocean?", ("S",), Document("It looks like an S.", "Ocean"))
    split = Split(train=[odd] + split.train, val=split.val, data_hash="test")
    trainer = Trainer(tiny_text_engine(tmp_path), split, _cfg(), tmp_path / "ck")
    trainer.order = [0, 3, 1, 2]
    ex, docs = trainer.example(0)
    assert ex is split.train[3] and len(docs) == 3
    assert trainer.example(1)[0] is split.train[3]  # the next index in order, as without the skip


def test_mixture_checkpoint_written_before_a_new_mixture_field_still_resumes(tmp_path):
    mix = Mixture(weights=(("nq", 1.0),), nq_docs=(2, 3), docs=3).check()
    part = Trainer(tiny_text_engine(tmp_path), _split(), _cfg(steps=2, mixture=mix), tmp_path / "m")
    part.run(val_every=0)
    ck = torch.load(part.checkpoint_path, weights_only=False)
    del ck["config"]["mixture"]["kv_answer"]  # as written before --mix-kv-answer
    torch.save(ck, part.checkpoint_path)
    assert Trainer(tiny_text_engine(tmp_path), _split(), _cfg(mixture=mix), tmp_path / "m").state.step == 2
    other = Mixture(weights=(("nq", 1.0),), nq_docs=(2, 3), docs=3, kv_answer="sentence").check()
    with pytest.raises(ValueError, match="other settings"):  # a real difference still refuses
        Trainer(tiny_text_engine(tmp_path), _split(), _cfg(mixture=other), tmp_path / "m")

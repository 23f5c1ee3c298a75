"""Several examples in one padded forward give each example's own loss and the same gradients."""

from __future__ import annotations

import torch

from factories import tiny_text_engine
from kvlink_rag.model.lora import adapter_scope
from training.example_loss import example_loss
from training.loop import Trainer
from training.packed import packed_loss
from training.samples import pack_item, sample_of

from test_loop import _cfg, _split


def _grads(trainer: Trainer) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in trainer.params]


def test_packed_loss_equals_the_mean_of_each_examples_loss_and_its_gradients(tmp_path):
    trainer = Trainer(tiny_text_engine(tmp_path), _split(), _cfg(docs=3), tmp_path / "ck")
    eng = trainer.engine
    torch.manual_seed(1)
    with torch.no_grad():  # a trained-looking adapter: B = 0 would leave LoRA A without a gradient
        for p in trainer.params[1:]:
            p.add_(0.05 * torch.randn_like(p))
    samples = [trainer.sample(i) for i in range(3)]
    assert len({sum(len(d.text) for d in s.docs) for s in samples}) > 1  # ragged: padding is exercised
    with adapter_scope(eng.lm, trainer.adapter):
        singles = torch.stack([example_loss(eng, trainer.link_embeds, sample_of(s), list(s.docs), trainer.cfg)
                               for s in samples])
        singles.mean().backward()
        want = _grads(trainer)
        for p in trainer.params:
            p.grad = None
        packed = packed_loss(eng.lm, eng.prefix, [pack_item(trainer, s) for s in samples], trainer.link_embeds,
                             eng.anchored)
        packed.backward()
    assert abs(float(packed.detach()) - float(singles.mean().detach())) < 1e-5
    for g, w in zip(_grads(trainer), want):
        assert torch.allclose(g, w, atol=1e-6, rtol=1e-4)


def test_a_packed_step_trains_as_the_unpacked_one(tmp_path):
    plain = Trainer(tiny_text_engine(tmp_path), _split(), _cfg(steps=3), tmp_path / "a")
    plain.run(val_every=0)
    packed = Trainer(tiny_text_engine(tmp_path), _split(), _cfg(steps=3, pack=True), tmp_path / "b")
    packed.run(val_every=0)
    assert [round(x, 4) for x in plain.state.losses] == [round(x, 4) for x in packed.state.losses]
    for p, q in zip(plain.params, packed.params):
        assert torch.allclose(p, q, atol=1e-5)

"""Link tokens initialised from documents' last hidden states: the embedding scale, distinct tokens, seeded."""

from __future__ import annotations

import pytest
import torch

from factories import tiny_text_engine
from training.link_init import document_link_init
from training.loop import Trainer

from test_loop import _cfg, _split


def test_document_init_has_the_embedding_scale_and_differs_from_the_separator(tmp_path):
    eng = tiny_text_engine(tmp_path)
    docs = [ex.gold for ex in _split().train]
    init = document_link_init(eng, docs, k=3, seed=0)
    norm = float(eng.lm.embed_tokens.weight.float().norm(dim=-1).mean())
    assert init.shape == (3, eng.lm.config.hidden_size)
    assert torch.allclose(init.norm(dim=-1), torch.full((3,), norm), rtol=0.1)
    assert torch.equal(init, document_link_init(eng, docs, k=3, seed=0))  # seeded
    assert not torch.equal(init, document_link_init(eng, docs, k=3, seed=1))
    per_slot = document_link_init(eng, docs, k=3, slots=2)
    assert per_slot.shape == (2, 3, eng.lm.config.hidden_size) and not torch.allclose(per_slot[0], per_slot[1])
    with pytest.raises(ValueError, match="at least 2 documents"):
        document_link_init(eng, docs[:1], k=3, slots=2)


def test_a_trainer_starts_from_the_document_init(tmp_path):
    sep = Trainer(tiny_text_engine(tmp_path), _split(), _cfg(), tmp_path / "a")
    doc = Trainer(tiny_text_engine(tmp_path), _split(), _cfg(link_init="document"), tmp_path / "b")
    assert doc.link_embeds.shape == sep.link_embeds.shape and not torch.equal(doc.link_embeds, sep.link_embeds)
    with pytest.raises(ValueError, match="unknown link init"):
        Trainer(tiny_text_engine(tmp_path), _split(), _cfg(link_init="zeros"), tmp_path / "c")
    doc.run(val_every=0)
    assert len(doc.state.losses) == doc.cfg.steps

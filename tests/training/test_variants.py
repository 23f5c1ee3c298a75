"""Training variants on a tiny random model: --init from a saved artifact, best-validation checkpoints and
the summary, the document-count curriculum, document-side training."""

from __future__ import annotations

import json

import pytest
import torch

from factories import tiny_text_engine
from kvlink_rag.linking.link_tokens import load_link_tokens
from kvlink_rag.model.lora import lora_state
from test_loop import _cfg, _split
from training.loop import Trainer
from training.train_config import TRAIN_ADAPTER


def _lora_params(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.params[1:]]


def test_init_starts_from_the_artifact_and_continues_the_example_order(tmp_path):
    first = Trainer(tiny_text_engine(tmp_path), _split(), _cfg(steps=2), tmp_path / "a")
    first.run(val_every=0)
    art = first.artifact({})
    assert art.metadata["steps"] == 2 and art.metadata["examples_seen"] == 4
    art.save(tmp_path / "a.safetensors", lora_dtype=torch.float32)

    engine = tiny_text_engine(tmp_path)  # a fresh model: everything must come from the file
    cont = Trainer(engine, _split(), _cfg(steps=2, init=str(tmp_path / "a.safetensors")), tmp_path / "b")
    assert torch.equal(cont.link_embeds.detach(), art.embeds)
    state = lora_state(engine.lm, TRAIN_ADAPTER)
    assert state.keys() == art.lora.keys() and all(torch.equal(state[n], art.lora[n]) for n in state)
    assert cont.state.step == 0 and cont.init_steps == 2 and cont.example_offset == 4
    assert all(not s for s in cont.opt.state.values())  # a fresh optimiser

    seen = []
    original = cont.example
    cont.example = lambda i: seen.append(i) or original(i)
    cont.run(val_every=0)
    assert seen == [4, 5, 6, 7]  # after the 4 examples the artifact was trained on
    assert cont.artifact({}).metadata["steps"] == 4 and cont.artifact({}).metadata["examples_seen"] == 8


def test_init_with_other_shapes_is_a_one_line_error(tmp_path):
    first = Trainer(tiny_text_engine(tmp_path), _split(), _cfg(steps=1), tmp_path / "a")
    first.run(val_every=0)
    first.artifact({}).save(tmp_path / "a.safetensors")
    with pytest.raises(ValueError, match=r"K 2 \(run: 3\).*rank 4 \(run: 8\)") as e:
        Trainer(tiny_text_engine(tmp_path), _split(), _cfg(k=3, rank=8, init=str(tmp_path / "a.safetensors")),
                tmp_path / "b")
    assert "\n" not in str(e.value)


def test_best_validation_step_is_kept_checkpointed_and_summarised(tmp_path):
    from training.outputs import last_path, save_outputs

    engine = tiny_text_engine(tmp_path)
    trainer = Trainer(engine, _split(), _cfg(steps=4, checkpoint_every=2, lr=0.5, link_lr=2.0), tmp_path / "ck")
    trainer.run(val_every=1)
    vals = dict(trainer.state.val_losses)
    assert sorted(vals) == [0, 1, 2, 3, 4]  # the start, every step
    best = min(vals, key=vals.get)
    assert trainer.state.best_step == best and trainer.state.best_val == vals[best]

    ck = torch.load(trainer.checkpoint_path, weights_only=False)
    assert all(torch.equal(a, b) for a, b in zip(ck["best_params"], trainer.best_params))
    resumed = Trainer(tiny_text_engine(tmp_path), _split(), _cfg(steps=4, checkpoint_every=2, lr=0.5, link_lr=2.0),
                      tmp_path / "ck")
    assert resumed.state.best_step == best and resumed.best_params is not None

    out = tmp_path / "links.safetensors"
    s = save_outputs(trainer, _split(), out, {})
    saved = json.loads(out.with_suffix(".json").read_text())
    assert saved["best_step"] == best and [c["step"] for c in saved["val_curve"]] == [0, 1, 2, 3, 4]
    assert saved["seconds_per_step"] > 0 and saved["device"] == "cpu" and s == saved
    art = load_link_tokens(out, engine.lm)
    assert art.metadata["steps"] == best and len(art.metadata["val_loss_curve"]) == 5
    assert torch.equal(art.embeds, trainer.best_params[0].float())
    assert last_path(out).exists() == (best != 4)


def test_curriculum_draws_a_seeded_document_count_per_example(tmp_path):
    engine = tiny_text_engine(tmp_path)
    trainer = Trainer(engine, _split(), _cfg(curriculum=(1, 4)), tmp_path / "ck")
    counts = [len(trainer.example(i)[1]) for i in range(40)]
    assert set(counts) == {1, 2, 3, 4}
    again = Trainer(engine, _split(), _cfg(curriculum=(1, 4)), tmp_path / "ck2")
    assert [len(again.example(i)[1]) for i in range(40)] == counts
    assert {len(Trainer(engine, _split(), _cfg(), tmp_path / "ck3").example(i)[1]) for i in range(10)} == {3}
    trainer.run(val_every=0)  # trains over the mixed counts


def test_doc_side_training_moves_the_adapter_and_marks_the_artifact(tmp_path):
    engine = tiny_text_engine(tmp_path)
    trainer = Trainer(engine, _split(), _cfg(steps=2, doc_side=True), tmp_path / "ck")
    before = _lora_params(trainer)
    trainer.run(val_every=0)
    assert any(not torch.equal(a, b) for a, b in zip(before, _lora_params(trainer)))
    assert len(engine.cache) == 0  # documents were encoded with the adapter, never memoised as base caches
    art = trainer.artifact({})
    assert art.metadata["doc_side"] is True


def test_time_limit_stops_after_a_validated_checkpointed_step(tmp_path):
    trainer = Trainer(tiny_text_engine(tmp_path), _split(), _cfg(steps=6, checkpoint_every=5), tmp_path / "ck")
    trainer.run(val_every=5, max_seconds=1e-9)
    assert trainer.state.step == 1 and [s for s, _ in trainer.state.val_losses] == [0, 1]
    assert Trainer(tiny_text_engine(tmp_path), _split(), _cfg(steps=6, checkpoint_every=5),
                   tmp_path / "ck").state.step == 1


def test_mlp_targets_train_and_load_for_eval(tmp_path):
    engine = tiny_text_engine(tmp_path)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    trainer = Trainer(engine, _split(), _cfg(steps=1, targets=targets), tmp_path / "ck")
    trainer.run(val_every=0)
    art = trainer.artifact({})
    assert any("down_proj" in n for n in art.lora)
    art.save(tmp_path / "mlp.safetensors")
    eng = tiny_text_engine(tmp_path).with_link_tokens(load_link_tokens(tmp_path / "mlp.safetensors", engine.lm))
    assert eng.adapter is not None and eng.doc_adapter is None


def test_a_curriculum_past_the_context_is_refused_before_training(tmp_path):
    from kvlink_rag.types import ContextTooLong
    from training.data import check_context

    engine = tiny_text_engine(tmp_path)
    three, six = check_context(engine, _split(), 3, 2, 16), check_context(engine, _split(), 6, 2, 16)
    per_doc = (six - three) / 3  # one document's share of the estimate: a passage and its 2 link tokens
    assert per_doc >= 1 + 2
    too_many = int((engine.lm.max_positions - three) / per_doc) + 5
    with pytest.raises(ContextTooLong, match=f"an example of {too_many} documents needs about .*use fewer documents"):
        Trainer(engine, _split(), _cfg(curriculum=(1, too_many)), tmp_path / "ck")
    assert not (tmp_path / "ck").exists()  # refused before anything was written


def test_init_may_add_lora_targets_which_start_at_zero(tmp_path):
    from kvlink_rag.model.lora import adapter_scope
    from training.example_loss import example_loss

    first = Trainer(tiny_text_engine(tmp_path), _split(), _cfg(steps=2, targets=("q_proj", "v_proj")), tmp_path / "a")
    first.run(val_every=0)
    first.artifact({}).save(tmp_path / "a.safetensors", lora_dtype=torch.float32)
    ex, docs = first.example(0)
    with torch.no_grad(), adapter_scope(first.engine.lm, first.adapter):
        before = float(example_loss(first.engine, first.link_embeds, ex, docs, first.cfg))

    wider = _cfg(steps=1, targets=("q_proj", "v_proj", "up_proj", "down_proj"), init=str(tmp_path / "a.safetensors"))
    engine = tiny_text_engine(tmp_path)
    cont = Trainer(engine, _split(), wider, tmp_path / "b")
    state = lora_state(engine.lm, TRAIN_ADAPTER)
    added = [n for n in state if ("up_proj" in n or "down_proj" in n) and "lora_B" in n]
    assert added and all(not state[n].any() for n in added)  # the new targets start at B = 0
    with torch.no_grad(), adapter_scope(engine.lm, cont.adapter):
        start = float(example_loss(engine, cont.link_embeds, ex, docs, cont.cfg))
    assert abs(start - before) < 1e-4  # the same function as the artifact
    cont.run(val_every=0)
    assert any(lora_state(engine.lm, TRAIN_ADAPTER)[n].any() for n in added)  # and they learn
    with pytest.raises(ValueError, match=r"targets q_proj,v_proj \(run: q_proj\)"):
        Trainer(tiny_text_engine(tmp_path), _split(), _cfg(targets=("q_proj",), init=str(tmp_path / "a.safetensors")),
                tmp_path / "c")

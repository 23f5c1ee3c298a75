"""Per-task validation bookkeeping of a mixture run: each task's curve, its best step with its parameters, the
overall score that picks the artifact, all kept across a resume."""

from __future__ import annotations

import pytest
import torch

from factories import tiny_text_engine
from training.loop import Trainer
from training.mixture import Mixture
from training.samples import overall_score, pack_item, slots

from test_loop import _cfg
from test_mixture import _examples

MIX = Mixture(weights=(("nq", 1.0), ("kv", 1.0), ("long", 1.0), ("retention", 1.0)), nq_docs=(2, 4), kv_docs=3,
              long_passages=(2, 3), retentions=(0.5,), docs=3)


def _split():
    from training.data import Split

    ex = _examples(30)
    return Split(train=ex[:-4], val=ex[-4:], data_hash="test")


def test_overall_score_is_the_mean_of_each_tasks_ratio_to_its_start():
    curves = {"nq": [(0, 2.0), (5, 1.0)], "kv": [(0, 4.0), (5, 3.0)]}
    assert overall_score(curves, 0) == 1.0
    assert overall_score(curves, 5) == pytest.approx((0.5 + 0.75) / 2)


def test_a_mixture_run_validates_every_task_and_keeps_each_tasks_best(tmp_path):
    cfg = _cfg(steps=4, accumulate=2, mixture=MIX, pack=True)
    tr = Trainer(tiny_text_engine(tmp_path, chunk_tokens=64), _split(), cfg, tmp_path / "ck")
    tr.run(val_every=2, val_n=2)
    st = tr.state
    assert set(st.val_by_task) == {"nq", "kv", "long", "retention"}
    for task, curve in st.val_by_task.items():
        assert [s for s, _ in curve] == [0, 2, 4]
        best = min(curve, key=lambda sv: sv[1])
        assert st.best_by_task[task] == best
        assert len(tr.best_by_task[task]) == len(tr.params)
    assert [v for _, v in st.val_losses] == pytest.approx([overall_score(st.val_by_task, s) for s in (0, 2, 4)])
    assert st.best_val == min(v for _, v in st.val_losses)

    again = Trainer(tiny_text_engine(tmp_path, chunk_tokens=64), _split(), cfg, tmp_path / "ck")
    assert again.state.val_by_task == st.val_by_task and again.state.best_by_task == st.best_by_task
    for task in st.best_by_task:
        assert all(torch.equal(a, b) for a, b in zip(again.best_by_task[task], tr.best_by_task[task]))


def test_long_samples_are_linked_as_the_store_chunks_them_and_retention_prunes(tmp_path):
    import dataclasses

    mix = dataclasses.replace(MIX, long_passages=(8, 10))
    tr = Trainer(tiny_text_engine(tmp_path, chunk_tokens=64), _split(), _cfg(mixture=mix), tmp_path / "ck")
    long = next(s for s in (tr.sample(i) for i in range(100)) if s.task == "long")
    assert len(slots(tr, long)) == len(tr.engine.chunks(long.docs[0])) > 1
    kept = next(s for s in (tr.sample(i) for i in range(100)) if s.task == "retention")
    item = pack_item(tr, kept)
    full = [tr.engine.get_or_encode(d)[0].num_tokens for d in kept.docs]
    assert sum(item.docs.num_tokens) < sum(full)


def test_a_long_sample_with_chunk_links_last_is_trained_as_the_engine_links_it(tmp_path):
    """``chunk_links`` 'last': the packed forward joins the chunks as serving does (no link tokens between them)
    and its loss is the linker's on the same slots; link tokens after every chunk give another loss."""
    import dataclasses

    from kvlink_rag.model.lora import adapter_scope
    from training.example_loss import example_loss
    from training.packed import packed_loss
    from training.samples import sample_of

    eng = tiny_text_engine(tmp_path, chunk_tokens=64, chunk_context=1, chunk_links="last")
    tr = Trainer(eng, _split(), _cfg(mixture=dataclasses.replace(MIX, long_passages=(8, 10))), tmp_path / "ck")
    long = next(s for s in (tr.sample(i) for i in range(100)) if s.task == "long")
    item, docs = pack_item(tr, long), slots(tr, long)
    assert item.joined == [True] * (len(docs) - 1) + [False] and len(docs) > 1
    with adapter_scope(eng.lm, tr.adapter), torch.no_grad():
        want = example_loss(eng, tr.link_embeds, sample_of(long), docs, tr.cfg)
        got = packed_loss(eng.lm, eng.prefix, [item], tr.link_embeds, eng.anchored)
        each = packed_loss(eng.lm, eng.prefix, [dataclasses.replace(item, joined=None)], tr.link_embeds, eng.anchored)
    assert abs(float(got) - float(want)) < 1e-5 and abs(float(each) - float(got)) > 1e-4

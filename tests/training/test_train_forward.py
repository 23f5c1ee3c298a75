"""The training forward in plain torch gives transformers' hidden states, loss and gradients."""

from __future__ import annotations

import pytest
import torch

from factories import randomise_lora, tiny_model, tiny_text_engine
from kvlink_rag.model.lora import adapter_scope, add_lora
from training.cached_attention import RaggedLayout
from training.loop import Trainer
from training.packed import _batched_cache, packed_loss
from training.samples import pack_item
from training.train_forward import TrainForward

from test_loop import _cfg, _split

TARGETS = ("q_proj", "v_proj", "o_proj", "gate_proj", "down_proj")  # some modules of a fused projection without


def _inputs(lm, b=2, n=11, q=5, seed=0):
    """Random RoPE'd caches ``[B, kv, n, hd]`` per layer, new-token embeds, positions and a causal-over-new mask."""
    cfg = lm.model.config
    g = torch.Generator().manual_seed(seed)
    kv, hd, layers = cfg.num_key_value_heads, cfg.head_dim, cfg.num_hidden_layers
    keys = [torch.randn(b, kv, n, hd, generator=g) for _ in range(layers)]
    values = [torch.randn(b, kv, n, hd, generator=g) for _ in range(layers)]
    embeds = torch.randn(b, q, cfg.hidden_size, generator=g)
    pos = torch.arange(n, n + q).repeat(b, 1) + torch.tensor([[0], [7]])
    mask = torch.zeros(b, q, n + q)
    mask[:, :, n:] = torch.triu(torch.full((q, q), torch.finfo(torch.float32).min), 1)
    mask[1, :, 2:4] = torch.finfo(torch.float32).min  # a masked cached span in one example
    return keys, values, embeds, pos, mask


def _reference(lm, keys, values, embeds, pos, mask):
    out = lm.decoder(inputs_embeds=embeds, position_ids=pos, attention_mask=mask[:, None],
                     cache=_batched_cache([k.clone() for k in keys], [v.clone() for v in values]), use_cache=True)
    return out.last_hidden_state


def _own(fwd, adapter, keys, values, embeds, pos, mask):
    """The own forward on the same examples, packed (``[B * Q, hidden]``) and returned as ``[B, Q, hidden]``."""
    b, q, hidden = embeds.shape
    kv, n, hd = keys[0].shape[1:]
    layout = RaggedLayout((q,) * b, (n,) * b, tuple(m.contiguous() for m in mask))
    flat_k, flat_v = fwd.kv_buffers(layout.kv_size(kv, hd), "cpu")
    for src_k, src_v, fk, fv in zip(keys, values, flat_k, flat_v):
        for i, (dk, dv) in enumerate(zip(layout.kv_views(fk, kv, hd), layout.kv_views(fv, kv, hd))):
            dk[:, :n], dv[:, :n] = src_k[i], src_v[i]
    return fwd(adapter, embeds.reshape(b * q, hidden), pos.reshape(-1), flat_k, flat_v, layout).view(b, q, hidden)


@pytest.mark.parametrize("family", ["llama", "llama3", "qwen2", "qwen3", "mistral"])
def test_hidden_states_and_gradients_equal_transformers_in_float32(family):
    lm = tiny_model(family)
    add_lora(lm, "a", rank=4, alpha=8, targets=TARGETS)
    randomise_lora(lm, "a", seed=1)
    keys, values, embeds, pos, mask = _inputs(lm)
    embeds.requires_grad_(True)
    w = torch.randn(embeds.shape)
    with adapter_scope(lm, "a"):  # peft marks the active adapter's parameters trainable
        params = [p for n, p in lm.model.named_parameters() if ".a." in n]
        for p in params:
            p.requires_grad_(True)
        want = _reference(lm, keys, values, embeds, pos, mask)
        want_grads = torch.autograd.grad((want * w).sum(), [embeds, *params])
        got = _own(TrainForward(lm, torch.float32), "a", keys, values, embeds, pos, mask)
        grads = torch.autograd.grad((got * w).sum(), [embeds, *params])
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)
    for g, r in zip(grads, want_grads):
        assert torch.allclose(g, r, atol=1e-5, rtol=1e-4)


def test_bfloat16_gemms_stay_close_to_float32():
    lm = tiny_model("llama")
    keys, values, embeds, pos, mask = _inputs(lm, n=40, q=9)
    exact = _own(TrainForward(lm, torch.float32), None, keys, values, embeds, pos, mask)
    fast = _own(TrainForward(lm, torch.bfloat16), None, keys, values, embeds, pos, mask)
    assert fast.dtype == torch.float32
    rel = (fast - exact).norm() / exact.norm()
    assert 0 < float(rel) < 2e-2  # bfloat16 rounding of weights, scores and probabilities, not more


def _grads(trainer: Trainer) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in trainer.params]


def test_a_packed_loss_through_the_own_forward_equals_transformers_and_its_gradients(tmp_path):
    trainer = Trainer(tiny_text_engine(tmp_path), _split(), _cfg(docs=3, pack=True, targets=TARGETS), tmp_path / "c")
    eng = trainer.engine
    torch.manual_seed(1)
    with torch.no_grad():
        for p in trainer.params[1:]:
            p.add_(0.05 * torch.randn_like(p))
    items = [pack_item(trainer, trainer.sample(i)) for i in range(3)]
    with adapter_scope(eng.lm, trainer.adapter):
        want = packed_loss(eng.lm, eng.prefix, items, trainer.link_embeds, eng.anchored)
        want.backward()
    want_grads = _grads(trainer)
    for p in trainer.params:
        p.grad = None
    with adapter_scope(eng.lm, trainer.adapter):
        got = packed_loss(eng.lm, eng.prefix, items, trainer.link_embeds, eng.anchored, trainer.train_forward(),
                          trainer.adapter)
        got.backward()
    assert abs(float(got.detach()) - float(want.detach())) < 1e-5
    for g, w in zip(_grads(trainer), want_grads):
        assert torch.allclose(g, w, atol=1e-6, rtol=1e-4)


def test_every_mixture_task_gives_transformers_loss_through_the_own_forward(tmp_path):
    """Retained documents (no direct fill: rotated layer by layer), chunked long documents and kv documents."""
    from test_samples import MIX

    trainer = Trainer(tiny_text_engine(tmp_path), _split(), _cfg(mixture=MIX, pack=True), tmp_path / "m")
    eng = trainer.engine
    picked = {}
    for i in range(200):
        s = trainer.sample(i)
        picked.setdefault(s.task, s)
        if len(picked) == 4:
            break
    assert set(picked) == {"nq", "kv", "long", "retention"}
    def items():  # a retained document's layer stream is read once: fresh items for each forward
        return [pack_item(trainer, s) for s in picked.values()]

    with adapter_scope(eng.lm, trainer.adapter):
        want = packed_loss(eng.lm, eng.prefix, items(), trainer.link_embeds, eng.anchored)
        got = packed_loss(eng.lm, eng.prefix, items(), trainer.link_embeds, eng.anchored, trainer.train_forward(),
                          trainer.adapter)
    assert abs(float(got.detach()) - float(want.detach())) < 1e-5


def test_a_model_whose_mlp_is_not_silu_is_refused():
    lm = tiny_model("llama", hidden_act="gelu")
    with pytest.raises(ValueError, match="silu only"):
        TrainForward(lm, torch.float32)

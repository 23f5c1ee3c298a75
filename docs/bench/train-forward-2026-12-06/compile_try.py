# Tried, not kept (session 2026-12-06b): torch.compile of the layer parts, interleaved with eager in one process.
# Its run printed steps 0-7 (27 s for step 0: the compile); from step 8 the steps encode documents not pre-encoded,
# so only steps 3-7 compare. Run: PYTHONPATH=. python docs/bench/train-forward-2026-12-06/compile_try.py
import sys, time, tempfile, statistics, os
from pathlib import Path
import torch
import torch.nn.functional as F
sys.path.insert(0, "scripts")
from bench_train_step import _engine, _trainer
class A: accumulate, docs = 4, 10
from cli.common import NQ_DEFAULT
from training import packed, train_forward
from training.data import split_examples
from training.samples import pack_item
from training.train_model import preencode
from kvlink_rag.model.lora import adapter_scope
from training.frozen_linear import frozen_lora_linear

def mlp(h, post_norm, eps, gu_w, gu_ab, down_w, down_ab, inter):
    x = F.rms_norm(h, (h.shape[-1],), post_norm, eps)
    gu = frozen_lora_linear(x, gu_w, None, gu_ab)
    g, u = gu.split(inter, -1)
    return h + frozen_lora_linear(F.silu(g) * u, down_w, None, down_ab)
def pre(h, input_norm, eps, w, bias, ab, cos, sin, nh, nkv, hd):
    b, nq, hidden = h.shape
    x = F.rms_norm(h, (hidden,), input_norm, eps)
    qkv = frozen_lora_linear(x, w, bias, ab)
    q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], -1)
    q, k = q.reshape(b, nq, nh, hd).transpose(1, 2), k.reshape(b, nq, nkv, hd).transpose(1, 2)
    v = v.reshape(b, nq, nkv, hd).transpose(1, 2)
    q = q * cos + torch.roll(q, hd // 2, -1) * sin
    k = k * cos + torch.roll(k, hd // 2, -1) * sin
    return q, k, v
def post(h, attn, o_w, o_ab, post_norm, eps, gu_w, gu_ab, down_w, down_ab, inter):
    b, nh, nq, hd = attn.shape
    h = h + frozen_lora_linear(attn.transpose(1, 2).reshape(b, nq, nh * hd), o_w, None, o_ab)
    return mlp(h, post_norm, eps, gu_w, gu_ab, down_w, down_ab, inter)
MODE = {"m": "eager"}
_cpost = torch.compile(post, dynamic=True)
_cpre = torch.compile(pre, dynamic=True)
def cpre(*a):
    return _cpre(*a) if MODE["m"] == "all" else pre(*a)
def cpost(*a):
    return _cpost(*a) if MODE["m"] in ("post", "all") else post(*a)

orig = train_forward.TrainForward._layer
def _layer(self, i, layer, adapter, h, cos, sin, k_all, v_all, mask):
    ls = train_forward.lora_stack
    q, k, v = cpre(h, layer.input_norm, self.eps, layer.qkv.weight, layer.qkv.bias, ls(layer.qkv.modules, adapter), cos, sin,
                   self.heads, self.kv_heads, self.head_dim)
    attn = train_forward.cached_attention(q, k, v, k_all, v_all, mask, self.head_dim ** -0.5, self.workspace, i)
    return cpost(h, attn, layer.o.weight, ls(layer.o.modules, adapter), layer.post_norm, self.eps, layer.gate_up.weight,
                 ls(layer.gate_up.modules, adapter), layer.down.weight, ls(layer.down.modules, adapter), self.intermediate)
train_forward.TrainForward._layer = _layer
engine, split = _engine("cpu"), split_examples(NQ_DEFAULT, 500, 50)
tr = _trainer(engine, split, A, {"bf16": True, "pack": True}, Path(tempfile.mkdtemp()))
preencode(engine.warm, [d for i in range(32) for d in tr.sample(i).docs])
res={m: [] for m in ("eager", "post", "all")}
for step in range(18):
    m = ("eager", "post", "all")[step % 3]
    MODE["m"] = m
    t0=time.perf_counter(); tr.step(); dt=time.perf_counter()-t0
    if step >= 3: res[m].append(dt)
    print(step, m, round(dt,3), flush=True)
for m, v in res.items(): print(m, "median", round(statistics.median(v),3), [round(x,2) for x in v])

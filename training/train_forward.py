"""The link-and-question forward of training in plain torch: the model runner's layout, with autograd.

:func:`training.packed.packed_loss` ran this forward through transformers' decoder with peft's LoRA layers: per
layer seven adapted linears (three GEMMs, a dropout call and a scaling each), separate q / k / v and gate / up
GEMMs, a ``DynamicCache`` concatenating every layer's cached and new keys, and
:func:`~training.fast_attention.train_attention` in torch ops. Here, as :mod:`kvlink_rag.runtime.model_runner`
lays the decoder out (gpt-fast / nano-vllm): one fused q|k|v and one gate|up projection a layer in ``dtype``
(bfloat16 copies of the frozen weights, made once), each adapter's terms fused per projection too (its A's
stacked, its B's block-diagonal, rebuilt every forward from the trained parameters, so gradients reach them),
RoPE at explicit position ids, attention by :class:`training.cached_attention.CachedAttention` over buffers that
hold the cache once per step. Norms, residual stream, SiLU, the adapters' masters and the loss stay float32; the
frozen GEMMs (with the adapters' terms riding in them, :mod:`training.frozen_linear`) and attention's matmuls run
in ``dtype``, as ``--bf16`` rounds the GEMMs on the transformers path. In bfloat16 on a CPU with AVX512-BF16, the
MLP's ``silu(gate) * up`` (from the gate|up GEMM's bfloat16 output) and RMSNorm run as one-pass kernels
(:mod:`training.elementwise`, float32 arithmetic as before).

Exactness (``dtype`` float32): the same loss and gradients as the transformers forward, to float rounding
(tests/training/test_train_forward.py). Families: those of :func:`kvlink_rag.model.families.family_of` (Llama,
Qwen2 with q/k/v biases, Qwen3 with q/k norms, Mistral), SiLU MLPs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvlink_rag.linking.rope import rope_cos_sin
from kvlink_rag.model.families import family_of
from kvlink_rag.model.loader import LoadedModel
from kvlink_rag.runtime.lora import projection_terms, stacked
from kvlink_rag.runtime.weights import base_linear, check_silu_mlp, fused_weight

from .cached_attention import RaggedLayout, Workspace, cached_attention
from .elementwise import elementwise_kernels, rms_norm, silu_mul
from .frozen_linear import frozen_lora_linear


@dataclass
class _Proj:
    """A frozen (fused) projection in the forward's dtype and the peft modules it stacks (for their adapters).
    ``weight`` is ``[out, in + rank]``: ``W`` then room for an adapter's ``B`` columns
    (:class:`training.frozen_linear.FrozenLoraLinear`), regrown when an adapter of a larger rank comes."""

    weight: torch.Tensor  # [out, in + rank]
    bias: torch.Tensor | None
    modules: list[torch.nn.Module]
    n_in: int

    def room(self, rank: int) -> torch.Tensor:
        """The augmented weight with at least ``rank`` columns after ``W`` (``[:, :n_in + rank]``)."""
        if self.weight.shape[1] < self.n_in + rank:
            grown = self.weight.new_zeros(self.weight.shape[0], self.n_in + rank)
            grown[:, : self.n_in] = self.weight[:, : self.n_in]
            self.weight = grown
        return self.weight[:, : self.n_in + rank]


@dataclass
class _Layer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: _Proj
    o: _Proj
    gate_up: _Proj
    down: _Proj
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None


def _proj(modules: list[torch.nn.Module], dtype: torch.dtype) -> _Proj:
    weight, bias = fused_weight(modules)
    return _Proj(weight.to(dtype), None if bias is None else bias.to(dtype), modules, int(weight.shape[1]))


def lora_stack(modules: list[torch.nn.Module], name: str | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Adapter ``name``'s terms in a (fused) projection as one pair: ``A`` ``[sum rank, in]`` and ``B``
    ``[sum out, sum rank]`` (block-diagonal, scales folded, zero rows for a module that is no target), so the
    projection's term is ``(x A^T) B^T``: the runner's stacking (:func:`kvlink_rag.runtime.lora.stacked`) over the
    whole projection, built from the peft parameters (differentiable). None: ``name`` is None or adapts none of
    ``modules``."""
    terms = projection_terms(modules, name) if name is not None else []
    if not terms:
        return None
    return stacked(terms, 0, sum(base_linear(m).out_features for m in modules))


class TrainForward:
    """The decoder over new tokens on top of cached KV, differentiable in the embeddings and the adapter.

    Args:
        lm: the loaded model (float32 weights; read once here, so later changes to its base weights are not seen;
            its adapters are read at every call).
        dtype: dtype of the frozen GEMMs and of attention's matmuls and KV buffers (bfloat16 on CPUs with native
            bfloat16, :func:`kvlink_rag.model.loader.cpu_has_native_bf16`; float32: exact).
    Raises:
        ValueError: an MLP activation other than SiLU.

    Attributes:
        ext: the elementwise kernels this forward uses (:func:`training.elementwise.elementwise_kernels`), or None
            for torch's ops (set it to None to compare the two).

    Memory: a copy of the frozen weights in ``dtype`` (~270 MB for SmolLM2-135M in bfloat16, its LM head included),
    and the :attr:`workspace`'s buffers, kept from step to step: every layer's attention probabilities and KV
    (~350 MB at 4 examples of 10 NQ documents in bfloat16). One forward per backward: a graph whose buffers a
    later forward rewrote fails in backward (version counters), never silently.
    """

    def __init__(self, lm: LoadedModel, dtype: torch.dtype = torch.bfloat16):
        cfg = lm.model.config
        check_silu_mlp(cfg)
        fam = family_of(cfg)
        self.dtype, self.lm = dtype, lm
        self.rotary_emb = fam.rotary_emb(lm.model)
        self.heads, self.kv_heads = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.intermediate, self.eps = int(cfg.intermediate_size), float(cfg.rms_norm_eps)
        self.layers = []
        for layer in fam.layers(lm.model):
            p = fam.parts(layer)
            self.layers.append(_Layer(
                p.input_norm.weight.detach(), p.post_norm.weight.detach(), _proj([p.q, p.k, p.v], dtype),
                _proj([p.o], dtype), _proj([p.gate, p.up], dtype), _proj([p.down], dtype),
                None if p.q_norm is None else p.q_norm.weight.detach(),
                None if p.k_norm is None else p.k_norm.weight.detach()))
        self.norm = fam.final_norm(lm.model).weight.detach()
        head = fam.lm_head(lm.model)
        self.head_weight = head.weight.detach().to(dtype)  # [vocab, hidden]
        self.head_bias = None if head.bias is None else head.bias.detach().to(dtype)
        self.workspace = Workspace()  # attention's probabilities and the KV buffers, reused step to step
        self.ext = elementwise_kernels(dtype, lm.device)  # the MLP's and the norms' kernels, or None: torch ops

    def __call__(self, adapter: str | None, embeds: torch.Tensor, position_ids: torch.Tensor,
                 keys: list[torch.Tensor], values: list[torch.Tensor], layout: RaggedLayout) -> torch.Tensor:
        """Final-normed hidden states of the new tokens of every example, packed without padding.

        Args:
            adapter: the query-side adapter applied to every projection it targets (None: base model).
            embeds: ``[T, hidden]`` float32 input embeddings of the examples' new tokens (``layout``'s rows).
            position_ids: ``[T]`` int64.
            keys, values: per layer a flat buffer in ``dtype`` (:meth:`kv_buffers`; per example
                :meth:`RaggedLayout.kv_views`) holding example ``i``'s RoPE'd cached keys and values in its first
                ``cached_i`` rows (the forward writes the new tokens after them).
            layout: rows, cache lengths and KVLink masks per example (:class:`RaggedLayout`).
        Returns:
            ``[T, hidden]`` float32.
        """
        cos, sin = rope_cos_sin(self.rotary_emb, position_ids, torch.float32, embeds.device)
        half = self.head_dim // 2
        sin = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)  # rotate_half(x) * sin == roll(x, half) * this
        cos, sin = cos[:, None], sin[:, None]  # [T, 1, head_dim]: every head
        h = embeds.float()
        for i, (layer, k_all, v_all) in enumerate(zip(self.layers, keys, values)):
            h = self._layer(i, layer, adapter, h, cos, sin, k_all, v_all, layout)
        return rms_norm(h, self.norm, self.eps, self.ext)

    def _linear(self, proj: _Proj, adapter: str | None, x: torch.Tensor, keep: bool = False) -> torch.Tensor:
        """``x W^T + b`` with the GEMM in ``dtype`` (float32 out; ``keep``: ``dtype`` out), plus the adapter's
        term."""
        term = lora_stack(proj.modules, adapter)
        weight = proj.weight if term is None else proj.room(int(term[0].shape[0]))
        return frozen_lora_linear(x, weight, proj.bias, term, keep)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[rows, vocab]`` float32 logits of final-normed ``hidden`` ``[rows, hidden]``, the LM head's GEMM in
        ``dtype`` (as ``--bf16`` computes it on the transformers path)."""
        return F.linear(hidden.to(self.dtype), self.head_weight, self.head_bias).float()

    def kv_buffers(self, size: int, device) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per layer a flat key and a flat value buffer of ``size`` elements in ``dtype``
        (:meth:`RaggedLayout.kv_size`, viewed per example by :meth:`RaggedLayout.kv_views`), reused from step to step
        (uninitialised). One buffer a layer, not views of one: a view shares its base's version counter, and each
        layer's forward writes its new tokens into its buffers after the previous layer saved its own."""
        n = len(self.layers)
        return ([self.workspace.get(("k", i), (size,), self.dtype, device) for i in range(n)],
                [self.workspace.get(("v", i), (size,), self.dtype, device) for i in range(n)])

    def _layer(self, i: int, layer: _Layer, adapter: str | None, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               k_all: torch.Tensor, v_all: torch.Tensor, layout: RaggedLayout) -> torch.Tensor:
        t = h.shape[0]
        hd, nh, nkv = self.head_dim, self.heads, self.kv_heads
        x = rms_norm(h, layer.input_norm, self.eps, self.ext)
        qkv = self._linear(layer.qkv, adapter, x)  # [T, (heads + 2 kv_heads) * head_dim]
        q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], -1)  # split: one concatenation in backward, not 3 fills
        q, k, v = q.reshape(t, nh, hd), k.reshape(t, nkv, hd), v.reshape(t, nkv, hd)
        if layer.q_norm is not None:
            q, k = F.rms_norm(q, (hd,), layer.q_norm, self.eps), F.rms_norm(k, (hd,), layer.k_norm, self.eps)
        q = q * cos + torch.roll(q, hd // 2, -1) * sin
        k = k * cos + torch.roll(k, hd // 2, -1) * sin
        attn = cached_attention(q, k, v, k_all, v_all, layout, hd ** -0.5, self.workspace, i)  # [T, heads, head_dim]
        h = h + self._linear(layer.o, adapter, attn.reshape(t, nh * hd))
        x = rms_norm(h, layer.post_norm, self.eps, self.ext)
        gu = self._linear(layer.gate_up, adapter, x, keep=self.ext is not None)  # [T, 2 * intermediate]
        return h + self._linear(layer.down, adapter, silu_mul(gu, self.intermediate, self.ext))

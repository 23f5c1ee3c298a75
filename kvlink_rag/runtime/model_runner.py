"""The model runner: one packed forward over a ragged batch, in plain torch with explicit position ids.

The Llama-family decoder (Llama, Qwen2 with q/k/v biases, Qwen3 with q/k norms, Mistral) as gpt-fast's
``Transformer`` and nano-vllm's ``model_runner`` write it: per layer RMSNorm, one fused q|k|v
projection, RoPE from the model's own rotary module at the given position ids, attention of each row
over its own KV (:func:`kvlink_rag.runtime.ragged.attend`, with the row's KVLink mask), the output projection, RMSNorm
and a fused gate|up SiLU MLP. No transformers module runs on this path; its forward is the reference
the exactness tests compare against (1e-4 in float32).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..linking.rope import rope_cos_sin
from ..model.families import family_of
from ..model.loader import LoadedModel
from .attention_probs import attend_and_mass, attention_mass
from . import fused_decode
from .cpu_kernels import kernels
from .linear import TokenSplit
from .lora import FusedLowRank, LayerLora, adapter_terms, prefill_gemm_dtype
from .merged_lora import project
from .ragged import RaggedBatch, attend, attend_with_lse
from .weights import LayerWeights, ModelWeights, model_weights


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim as Llama computes it (float32 statistics, weight applied in ``x``'s dtype);
    float32 inputs take torch's fused kernel (the same arithmetic)."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        ext = kernels()
        if ext is not None and x.dim() == 2 and x.device.type == "cpu":  # one call, not torch's composite
            return ext.rms_norm(x, weight, eps)
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class ModelRunner:
    """Runs packed forwards of one loaded model (see module docstring).

    Args:
        model: the transformers ``*ForCausalLM`` (its weights are shared, see :mod:`.weights`).
        fmt: weight format (:data:`~kvlink_rag.runtime.linear.WEIGHT_FORMATS`).

    Attributes:
        fused: steps of decode rows take :mod:`.fused_decode`'s C++ layer halves where they fit (default True;
            False keeps the general path, which the exactness tests compare them with).
    """

    def __init__(self, model: torch.nn.Module, fmt: str = "native"):
        self.model = model
        self.rotary_emb = family_of(model.config).rotary_emb(model)
        self.weights: ModelWeights = model_weights(model, fmt)
        self.lora_dtype = prefill_gemm_dtype(fmt)  # the adapter terms' GEMMs
        self._adapters: dict[str, list[LayerLora]] = {}
        self.fused = True  # steps of decode rows take fused_decode's C++ halves where they fit

    def forget_adapters(self) -> None:
        """Drop the cached adapter terms (after an adapter was added or removed)."""
        self._adapters.clear()

    def prepare(self, adapter: str | None) -> None:
        """Build ``adapter``'s terms now and, where prefill rows multiply in bfloat16, its weights merged into theirs
        (:meth:`~.lora.FusedLowRank.merged`), instead of in the first request that uses it: on the AMX Xeon of session
        2026-12-08 the first linked query after start took 0.30 s to its first token against 0.05 s for the next
        ones, 0.23 s of it the merge (BENCHMARKS.md). None: nothing to build."""
        for layer in self._terms(adapter) or []:
            for term in layer.present():
                term.merged()

    def _terms(self, adapter: str | None) -> list[LayerLora] | None:
        if adapter is None:
            return None
        if adapter not in self._adapters:
            self._adapters[adapter] = adapter_terms(self.model, adapter, self.lora_dtype)
        return self._adapters[adapter]

    @torch.inference_mode()
    def forward(self, batch: RaggedBatch, embeds: torch.Tensor, position_ids: torch.Tensor,
                adapter: str | None = None, between_layers: Callable[[], None] | None = None) -> torch.Tensor:
        """One packed forward; returns the logits after each row's last new token.

        Args:
            batch: the rows in packing order; each row's sequence is extended by its new tokens.
            embeds: ``[T_total, hidden]`` input embeddings (compute dtype).
            position_ids: ``[T_total]`` int64 RoPE position of each new token.
            adapter: the query-side LoRA adapter to apply (None: the base model).
            between_layers: called after each decoder layer but the last of the general path (not the fused
                decode rows'): the scheduler runs forwards of other sequences there (a long prompt's step yields to
                new short requests); this forward's state is its own (``h``, its rows' uncommitted KV).
        Returns:
            ``[rows, vocab]`` float32 logits.
        """
        w, lora = self.weights, self._terms(adapter)
        fits = self.fused and fused_decode.fits(w, lora, embeds)
        if fits and len(batch.rows) > 1:
            decode = [j for j, r in enumerate(batch.rows) if fused_decode.plain_decode(r)]
            if 0 < len(decode) < len(batch.rows):
                return self._split_forward(batch, embeds, position_ids, adapter, decode, between_layers)
        lengths = [r.length for r in batch.rows]
        split = TokenSplit.of_rows(lengths, embeds.device)  # each row's tokens take its own weight format
        rows = fused_decode.DecodeRows.of(batch) if fits else None
        fused = rows is not None
        # h: [T, hidden]; a fused step's residual stream is float32 (fused_decode.py), bfloat16 widens exactly
        h = embeds.float() if fused else embeds
        cos, sin = rope_cos_sin(self.rotary_emb, position_ids.to(h.device), h.dtype)  # [T, head_dim]
        half = sin.shape[-1] // 2
        sin = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)  # rotate_half(x) * sin == roll(x, half) * this
        if fused:
            cos, sin = cos.contiguous(), sin.contiguous()
        for i, layer in enumerate(w.layers):
            term = None if lora is None else lora[i]
            if fused:  # decode rows: three C++ calls a layer (fused_decode.py)
                qkv = fused_decode.layer_pre(w, layer, term, h, cos, sin)
                h = fused_decode.layer_post(w, layer, term, h, fused_decode.attend(w, i, qkv, rows))
            else:
                h = self._layer(i, layer, term, h, cos, sin, batch, split)
                if between_layers is not None and i + 1 < len(w.layers):
                    between_layers()
        batch.commit()
        last = torch.tensor([r.start + r.length - 1 for r in batch.rows], device=h.device)
        x = rms_norm(h[last], w.norm, w.eps)  # [rows, hidden]
        return w.lm_head(x, TokenSplit.of_rows(lengths, x.device, one_per_row=True)).float()

    def _split_forward(self, batch: RaggedBatch, embeds: torch.Tensor, position_ids: torch.Tensor,
                       adapter: str | None, decode: list[int], between_layers=None) -> torch.Tensor:
        """A step mixing decode rows (indexes ``decode``) with others (prefills, masked or explained rows): the
        decode rows as one fused forward, the rest as one general forward. Rows never see each other's
        tokens, and a decode row's linears take the small format either way (:class:`~.linear.TokenSplit`),
        so each row's logits are those it gets alone; ``[rows, vocab]`` float32 in ``batch``'s order."""
        keep = set(decode)
        out = None
        for idx in (decode, [j for j in range(len(batch.rows)) if j not in keep]):
            sub, take = batch.subset(idx)
            take = take.to(embeds.device)
            logits = self.forward(sub, embeds[take], position_ids[take], adapter, between_layers)
            out = logits.new_empty(len(batch.rows), logits.shape[1]) if out is None else out
            out[idx] = logits
        return out

    def _layer(self, i: int, layer: LayerWeights, lora: LayerLora | None, h: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor, batch: RaggedBatch, split: TokenSplit) -> torch.Tensor:
        w = self.weights
        t, hd = h.shape[0], w.head_dim
        x = rms_norm(h, layer.input_norm, w.eps)
        qkv = _adapted(layer.qkv, None if lora is None else lora.qkv, x, split)  # [T, (heads + 2 kv_heads) * hd]
        nq, nk = w.heads * hd, w.kv_heads * hd
        q = qkv[:, :nq].view(t, w.heads, hd)
        k = qkv[:, nq: nq + nk].view(t, w.kv_heads, hd)
        v = qkv[:, nq + nk:].view(t, w.kv_heads, hd).transpose(0, 1)  # v: [kv_heads, T, head_dim]
        q, k = self._rope(layer, q, k, cos, sin)
        attn = self._attend_rows(i, q, k, v, batch).transpose(0, 1).reshape(t, nq)  # [T, heads * head_dim]
        return self._mlp(layer, lora, h, attn, split)

    def _rope(self, layer: LayerWeights, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """q ``[T, heads, hd]``, k ``[T, kv_heads, hd]`` -> after the q/k norms (Qwen3) and RoPE, head-major
        (``[heads, T, hd]``, ``[kv_heads, T, hd]``)."""
        w = self.weights
        if layer.q_norm is not None:
            q, k = rms_norm(q, layer.q_norm, w.eps), rms_norm(k, layer.k_norm, w.eps)
        q, k = q.transpose(0, 1), k.transpose(0, 1)
        half = w.head_dim // 2  # RoPE as rotate-half: x * cos + [-x2, x1] * sin, with the sign folded into sin
        return q * cos + torch.roll(q, half, -1) * sin, k * cos + torch.roll(k, half, -1) * sin

    def _attend_rows(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: RaggedBatch
                     ) -> torch.Tensor:
        """Each row's new K/V written to its sequence, then its attention over its pieces with its mask;
        ``[heads, T, head_dim]``."""
        out = torch.empty_like(q)
        scale = self.weights.head_dim ** -0.5
        for row in batch.rows:
            s, e = row.start, row.start + row.length
            row.seq.write(i, k[:, s:e], v[:, s:e])
            pieces = list(row.seq.layer_kv(i, row.length))
            if row.attention is None:
                out[:, s:e] = attend(q[:, s:e], pieces, row.mask, scale, row.causal)
                continue
            a = row.attention  # explain, importance: the probabilities too, for the rows that ask
            both = None if a.plain_output else attend_and_mass(q[:, s:e], pieces, row.mask, scale, a.skip,
                                                                 a.exclude_self, a.first_key)
            if both is None:
                o, lse = attend_with_lse(q[:, s:e], pieces, row.mask, scale, row.causal)
                both = o, attention_mass(q[:, s:e], pieces, row.mask, scale, a.skip, a.exclude_self, a.first_key, lse)
            out[:, s:e] = both[0]
            a.add(i, both[1])
        return out

    def _mlp(self, layer: LayerWeights, lora: LayerLora | None, h: torch.Tensor, attn: torch.Tensor,
             split: TokenSplit) -> torch.Tensor:
        """The output projection, residual and the SiLU MLP with its residual: the layer's output ``[T, hidden]``."""
        w = self.weights
        o = _adapted(layer.o, None if lora is None else lora.o, attn, split)
        h = h + o
        x = rms_norm(h, layer.post_norm, w.eps)
        gu = _adapted(layer.gate_up, None if lora is None else lora.gate_up, x, split)  # [T, 2 * intermediate]
        a = F.silu(gu[:, : w.intermediate]) * gu[:, w.intermediate:]
        d = _adapted(layer.down, None if lora is None else lora.down, a, split)
        return h + d


def _adapted(linear, term: FusedLowRank | None, x: torch.Tensor, split: TokenSplit) -> torch.Tensor:
    """``linear(x)`` plus the adapter's ``term`` (None: none): prefill rows through the merged weights where the
    term has them (:mod:`.merged_lora`), the other rows' terms added as :meth:`FusedLowRank.add_to` adds them."""
    if term is None:
        return linear(x, split)
    merged = term.merged()
    if merged is None:
        y = linear(x, split)
        term.add_to(y, x, split)
        return y
    y, rest = project(linear, merged, x, split)
    if rest:
        term.add_small(y, x, split)
    return y


def get_runner(lm: LoadedModel) -> ModelRunner:
    """The runner of ``lm``, built on first use in ``lm.weight_format`` (for ``native`` the fused weights are
    copied once and the model's own parameters become views of them, so nothing is held twice)."""
    if not isinstance(lm.runner, ModelRunner):
        lm.runner = ModelRunner(lm.model, lm.weight_format)
    return lm.runner


def forward_ragged(lm: LoadedModel, batch: RaggedBatch, embeds: torch.Tensor, position_ids: torch.Tensor,
                   between_layers: Callable[[], None] | None = None) -> torch.Tensor:
    """:meth:`ModelRunner.forward` of ``lm``'s runner with the adapter :func:`kvlink_rag.model.lora.adapter_scope`
    turned on (``lm.active_adapter``).

    Args:
        batch: the rows (in packing order); each row's sequence is extended by its new tokens.
        embeds: ``[T_total, hidden]`` input embeddings of the packed new tokens (compute dtype).
        position_ids: ``[T_total]`` int64 position of each new token (RoPE).
        between_layers: see :meth:`ModelRunner.forward`.
    Returns:
        ``[rows, vocab]`` float32 logits.
    Raises:
        KeyError: the active adapter is no longer loaded (never a silent base-model answer).
    """
    if lm.active_adapter is not None and lm.active_adapter not in lm.adapters:
        raise KeyError(f"adapter {lm.active_adapter!r} was unloaded while a request was using it")
    return get_runner(lm).forward(batch, embeds, position_ids, lm.active_adapter, between_layers)

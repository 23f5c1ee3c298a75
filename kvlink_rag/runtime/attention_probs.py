"""Attention probabilities of the rows that ask for them (explain), computed beside the runner's attention.

SDPA never materialises the probabilities. For a row flagged with a receiver (:class:`MassReceiver`, the
``attention`` of :class:`kvlink_rag.runtime.ragged.RaggedRow`) the runner also calls :func:`attention_mass`: the
explicit ``softmax(q K^T * scale + mask)`` in float32 (transformers' eager kernel), summed over heads and
the counted query rows, one ``[keys]`` vector per layer. The row's output still comes from the ordinary
kernel, so an explained answer is the same as the plain one; only these rows pay the extra matmul.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .ragged import widened


class MassReceiver(Protocol):
    """Takes one layer's attention mass of a row.

    Attributes:
        skip: the row's first query rows not counted (e.g. link tokens before the question).
        exclude_self: a query's probability on its own key not counted (H2O's importance: attention
            received from later tokens).
        first_key: the keys before it are not read by :meth:`add` (their mass may be left 0; importance scores
            only a document's own keys, not the anchor prefix or the chunks before it).
        plain_output: the row's output must be the plain kernel's, bit for bit (explain: an explained answer is
            the plain answer); False (importance at precompute): output and mass may come from one explicit softmax
            (:func:`attend_and_mass`), the output within float32 rounding of the plain kernel's.
    """

    skip: int
    exclude_self: bool
    first_key: int
    plain_output: bool

    def add(self, layer: int, mass: torch.Tensor) -> None:
        """``mass``: ``[keys]`` float32, probabilities summed over heads and counted rows (keys in storage order)."""


ROW_BLOCK = 256  # query rows per block: a block's scores stay in cache, the masked tail of its keys is skipped


def attention_mass(q: torch.Tensor, pieces: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor | None,
                   scale: float, skip: int = 0, exclude_self: bool = False, first_key: int = 0,
                   lse: torch.Tensor | None = None) -> torch.Tensor:
    """``[keys]`` float32 attention probabilities of query rows ``skip..`` summed over heads and rows.

    Computed in blocks of :data:`ROW_BLOCK` query rows, each query group against its own kv head (no copy
    of the keys per head), and only over the keys some row of the block can see (a causal block skips the
    keys after its last row: half the work of a document's own prefill).

    Args:
        q: ``[heads, n, head_dim]`` queries after RoPE; pieces: ``(k, v)`` ``[kv_heads, tokens_i, head_dim]`` in
            storage order (grouped-query: head ``h`` reads kv head ``h // (heads / kv_heads)``); the last ``n``
            keys are the queries' own.
        mask: additive ``[n, keys]`` or None (every key visible); scale: softmax scale.
        exclude_self: leave out each query's probability on its own key.
        first_key: only keys ``first_key..`` counted (the rest 0). Where they are at most half of the keys (a chunk
            after the chunks before it) on the CPU, each row's log-sum-exp over every key comes from torch's fused
            flash kernel and only these keys' probabilities are formed (:func:`_mass_after`): 2.5x faster at 512
            queries over 16k keys, where the importance mass took 63% of a chunked document's encode
            (``docs/bench/importance-past-2026-12-06i``).
        lse: ``[heads, n]`` float32 log-sum-exp of every query row's scaled, masked scores over every key, when the
            attention that produced the rows' output had it (:func:`~.ragged.attend_with_lse`): the path above then
            makes no pass of its own over every key. None: computed here where needed.
    """
    k = torch.cat([kk for kk, _ in pieces], dim=1) if len(pieces) > 1 else pieces[0][0]
    k = k.float()  # [kv_heads, keys, head_dim]
    kv, keys, d = k.shape
    heads, n = int(q.shape[0]), int(q.shape[1])
    g = heads // kv
    if 0 < keys - first_key <= first_key and q.device.type == "cpu" and skip < n:
        return _mass_after(q[:, skip:].float(), k, None if mask is None else mask[skip:].float(), scale,
                           exclude_self, first_key, n - skip, None if lse is None else lse[:, skip:])
    mass = torch.zeros(keys, dtype=torch.float32, device=q.device)
    for a in range(skip, n, ROW_BLOCK):
        b = min(n, a + ROW_BLOCK)
        m = None if mask is None else mask[a:b].float()
        cols = keys if m is None else _visible(m)
        qs = q[:, a:b].float().reshape(kv, g * (b - a), d)  # head h = kv head h // g
        s = torch.matmul(qs, k[:, :cols].transpose(1, 2)).mul_(scale).view(kv, g, b - a, cols)
        if m is not None:
            s.add_(m[:, :cols])
        _add_rows(mass, torch.softmax(s, dim=-1), keys - n + a, exclude_self)
    return mass


EXPLICIT_ROWS = 128  # query rows per block of attend_and_mass: a block's scores stay small (SmolLM2: 3 x 384 x keys)


def attend_and_mass(q: torch.Tensor, pieces: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor | None,
                    scale: float, skip: int = 0, exclude_self: bool = False, first_key: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A row's attention output and its :func:`attention_mass` from one explicit float32 softmax per block of
    :data:`EXPLICIT_ROWS` query rows (``bmm``, the mask added, softmax, ``bmm`` with the values; each block only
    over the keys up to its last row's own): the scores are formed once, where the fused kernel's output and a
    separate mass pass formed them twice (10 ~410-token documents on an Ice Lake Xeon: 8.7 s with scores against
    7.3 s without before, now 6.9-7.0 s against 7.0 s; a 7,876-token block 74.4 -> 44.2 s against 39.5 s without;
    ``docs/bench/icelake-2026-12-07b``). The output equals
    :func:`~.ragged.attend`'s within float32 rounding (~1e-6), not bit for bit: for receivers without
    ``plain_output``.

    Args: as :func:`attention_mass`; ``mask`` the row's additive ``[n, keys]``, causal among the row's own keys
        (the last ``n``: a query never sees a later query's key).
    Returns:
        ``([heads, n, head_dim]`` float32, ``[keys]`` float32 mass``)``, or None where this does not apply: not a
        float32 CPU prefill row with a mask, or the keys before ``first_key`` at least as many as the rest (a chunk
        after a long past: there :func:`attention_mass` takes the fused kernel's log-sum-exp and forms only the
        chunk's own keys' probabilities).
    """
    keys = sum(int(pk.shape[1]) for pk, _ in pieces)
    if q.device.type != "cpu" or q.dtype != torch.float32 or mask is None or 0 < keys - first_key <= first_key:
        return None
    one = len(pieces) == 1 and pieces[0][0].dtype == torch.float32
    k, v = pieces[0] if one else widened(pieces)  # [kv_heads, keys, head_dim] float32: one copy, none for one piece
    kv, _, d = k.shape
    heads, n = int(q.shape[0]), int(q.shape[1])
    g = heads // kv
    out, mass = torch.empty_like(q), torch.zeros(keys, dtype=torch.float32)
    qs_all = (q * scale).view(kv, g, n, d)  # the scale on the queries: ~1e-7 from scaling the scores
    for a in range(0, n, EXPLICIT_ROWS):
        b = min(n, a + EXPLICIT_ROWS)
        cols = keys - n + b  # a prefill row never sees a later query's key
        qs = qs_all[:, :, a:b].reshape(kv, g * (b - a), d)  # head h = kv head h // g
        s = torch.bmm(qs, k[:, :cols].transpose(1, 2))  # [kv_heads, g * rows, cols]
        s.view(kv, g, b - a, cols).add_(mask[a:b, :cols].float())
        p = torch.softmax(s, dim=-1)
        out.view(kv, g, n, d)[:, :, a:b] = torch.bmm(p, v[:, :cols]).view(kv, g, b - a, d)
        if b > skip:
            c = max(a, skip) - a  # the block's first counted row
            _add_rows(mass, p.view(kv, g, b - a, cols)[:, :, c:], keys - n + a + c, exclude_self)
    return out, mass


def _add_rows(mass: torch.Tensor, p: torch.Tensor, own0: int, exclude_self: bool) -> None:
    """Add probabilities ``p`` ``[kv_heads, group, rows, cols]`` summed over heads and rows to ``mass`` ``[keys]``;
    with ``exclude_self`` without each row's probability on its own key (row ``r``'s is key ``own0 + r``)."""
    pm = p.sum(dim=(0, 1))  # [rows, cols]
    mass[: pm.shape[1]] += pm.sum(0)
    if exclude_self:
        r = torch.arange(pm.shape[0], device=pm.device)
        mass.index_add_(0, r + own0, -pm[r, r + own0])


def _mass_after(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, scale: float, exclude_self: bool,
                first_key: int, rows: int, lse: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`attention_mass` of float32 queries ``q`` ``[heads, rows, d]`` (the last ``rows`` keys their own) over
    keys ``first_key..`` of ``k`` ``[kv_heads, keys, d]``: ``exp(s - lse)`` with each row's log-sum-exp ``lse``
    ``[heads, rows]`` over every key as given, else from torch's CPU flash kernel (it forms no probabilities), the
    scores ``s`` only for those keys."""
    kv, keys, d = k.shape
    heads, g = int(q.shape[0]), int(q.shape[0]) // kv
    if lse is None:  # grouped-query heads native to the kernel (no key head per query head)
        _, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q[None], k[None], k[None], 0.0, False, attn_mask=None if mask is None else mask[None, None], scale=scale)
        lse = lse[0]
    lse = lse.reshape(kv, g, rows, 1)  # [kv_heads, group, rows, 1]
    own = k[:, first_key:]  # [kv_heads, t, d]
    t = int(own.shape[1])
    mass = torch.zeros(keys, dtype=torch.float32, device=q.device)
    qs = q.reshape(kv, g * rows, d)
    for a in range(0, rows, ROW_BLOCK):
        b = min(rows, a + ROW_BLOCK)
        m = None if mask is None else mask[a:b, first_key:]
        cols = t if m is None else _visible(m)  # a causal block's later keys are skipped
        s = torch.matmul(qs.view(kv, g, rows, d)[:, :, a:b].reshape(kv, g * (b - a), d), own[:, :cols].transpose(1, 2))
        s = s.mul_(scale).view(kv, g, b - a, cols)
        if m is not None:
            s.add_(m[:, :cols])
        p = torch.exp(s.sub_(lse[:, :, a:b])).sum(dim=(0, 1))  # [b - a, cols]
        mass[first_key:first_key + cols] += p.sum(0)
        if exclude_self:
            r = torch.arange(b - a, device=q.device)
            at = r + (keys - rows + a - first_key)  # each query's own key, among keys first_key..
            r, at = r[at < cols], at[at < cols]
            mass[first_key:].index_add_(0, at, -p[r, at])
    return mass


def _visible(m: torch.Tensor) -> int:
    """How many leading columns of the additive mask ``m`` ``[rows, cols]`` hold every key some row sees."""
    seen = (m > torch.finfo(m.dtype).min / 2).any(0).nonzero()
    return int(seen.max()) + 1 if len(seen) else 0

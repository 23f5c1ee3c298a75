"""Explain inside the batching scheduler: one request's attention mass over its KV slots, row by row.

A :class:`RowAttention` rides on an explained request (``RunningRequest.attention``) and is handed to the
model runner with each of its rows (:class:`kvlink_rag.runtime.ragged.RaggedRow` ``attention``): the runner adds
each layer's probabilities of the counted query rows (:func:`kvlink_rag.runtime.attention_probs.attention_mass`).
Counted are the question's rows of the prompt's prefill (not its link tokens, which precede the question)
and every decode row: what :class:`kvlink_rag.explain.attribution.AttentionMass` sums under transformers' hooks on
the one-request path, so :func:`kvlink_rag.explain.answers.attribution` reads either.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .attribution import AttentionMass


class RowAttention:
    """Attention mass per KV slot (storage order) of one request's counted rows.

    Args:
        skip_rows: rows of the prompt's prefill not counted (its link tokens, the first ones).
    Attributes:
        mass: the :class:`AttentionMass` (``mass.mass``: ``[slots]`` float32, summed over heads, layers, rows).
        skip: rows of the chunk being computed not counted (set by :meth:`chunk`).
    """

    exclude_self = False
    first_key = 0  # every key's mass is read
    plain_output = True  # an explained answer is the plain answer

    def __init__(self, skip_rows: int):
        self.skip_rows = skip_rows
        self.skip = 0
        self.mass = AttentionMass()

    def chunk(self, a: int, b: int) -> None:
        """The next forward computes rows ``a..b-1`` of the pending prefill (a decode: ``0..1``)."""
        self.skip = max(0, min(b, self.skip_rows) - a)

    def prompt_done(self) -> None:
        """The prompt is computed: every later row (decoding) counts."""
        self.skip_rows = self.skip = 0

    def add(self, layer: int, mass: torch.Tensor) -> None:
        """One layer's ``[keys]`` mass of the counted rows."""
        m = mass.float().cpu()
        total = self.mass.mass
        if m.numel() > total.numel():
            total = F.pad(total, (0, m.numel() - total.numel()))
        total[: m.numel()] += m
        self.mass.mass = total

"""The LM head of a decode step: int8 scores for the whole vocabulary, the top candidates re-scored exactly.

A decode step of a small model reads the head more than any layer (SmolLM2-135M: a 49,152 x 576 tied
embedding, 56 MB in bfloat16 against 1.5 MB of int4 per layer), and a one-token GEMV of it in bfloat16 runs
at ~7 ms on one thread of this CPU where int8 weight-only takes ~2.2 ms (``kvlink-rag bench-engine``).
int8 per-channel rounding moves each logit by ~1% of its size, which can swap near-tied tokens, so the
``k`` best int8 candidates of each row are re-scored with the exact weight's rows: a greedy token is the exact
head's token whenever that token is among the ``k`` int8 best (a rank it would need to fall ~k places to
lose), and the top logits a sampler or ``top_logprobs`` reads are the exact ones; the rest of the
vocabulary keeps its int8 logits. The same two-stage scoring as a retrieval re-ranker; for LM heads see
"Fast Inference from Transformers via Speculative Decoding"-style cheap-then-exact verification.
"""

from __future__ import annotations

import torch

from .linear import DenseLinear, Int8Linear, Linear, TokenSplit

RESCORE_TOP = 64  # candidates per row re-scored with the exact head


class RescoredHead:
    """``logits = x W^T`` with ``W`` read as int8 for every token and exactly for each row's top ``k``.

    Args:
        exact: the exact head (its ``weight`` ``[vocab, hidden]`` in bfloat16 or float32; no bias).
        k: candidates per row re-scored exactly.
        approx: the int8 scoring head (default: torch's int8 weight-only kernel over ``exact``'s weight; the
            q4q8 formats pass the Q8 x Q8 kernel's, :class:`~kvlink_rag.runtime.q4q8.Q8Q8Linear`).
    Raises:
        ValueError: ``exact`` has a bias.
    """

    def __init__(self, exact: DenseLinear, k: int = RESCORE_TOP, approx: Linear | None = None):
        if exact.bias is not None:
            raise ValueError("RescoredHead expects a head without bias")
        self.exact, self.k = exact, k
        self.approx = approx if approx is not None else Int8Linear(exact.weight)
        self.out_features = exact.out_features

    def __call__(self, x: torch.Tensor, split: TokenSplit | None = None) -> torch.Tensor:
        """Args: ``x`` ``[rows, hidden]``. Returns ``[rows, vocab]`` in ``x``'s dtype: int8 logits, with each
        row's ``k`` best replaced by the exact head's."""
        logits = self.approx(x)  # [rows, vocab]
        top = logits.topk(min(self.k, logits.shape[-1]), dim=-1).indices  # [rows, k]
        w = self.exact.weight
        rows = w[top]  # [rows, k, hidden] in the exact head's dtype
        exact = torch.bmm(rows, x.to(w.dtype)[:, :, None])[:, :, 0]  # [rows, k]
        return logits.scatter_(-1, top, exact.to(logits.dtype))

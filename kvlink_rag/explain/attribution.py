"""Per-document attribution: where the question and answer tokens put their attention.

While a linked answer is made, :class:`AttentionMass` (a :func:`kvlink_rag.model.attention.capture_attention`
callback) sums the attention probabilities of the question's and the answer's tokens (link tokens
excluded) over heads and layers, per cache slot. :func:`attribute` turns the slots into shares of the
prefix and of each document (the shares over prefix and documents sum to 1; attention a token pays to
link, question or earlier answer tokens is left out), and the most-attended spans of each document into
passages given as character offsets into the document's text. The heavy-hitter attention statistics of
H2O (Zhang et al., 2023, arXiv 2306.14048) read the other way round: as evidence of what was used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..linking.context import Segment
from ..linking.mask import segment_ids

PASSAGE_TOKENS = 12
PASSAGES_PER_DOCUMENT = 2


class AttentionMass:
    """Attention mass per cache slot from the query rows of every forward in a capture.

    Args:
        skip_rows: query rows of the *first* forward not counted (the link tokens, which precede the
            question in the link forward); later forwards (decoding) count every row.
    Attributes:
        mass: ``[slots]`` float32, summed over heads, layers and counted rows (slots in cache storage order).
    """

    def __init__(self, skip_rows: int = 0):
        self.skip_rows = skip_rows
        self.forwards = 0
        self.active = True  # False: forwards in between (e.g. scoring a reference answer) are not counted
        self.mass = torch.zeros(0, dtype=torch.float32)

    def __call__(self, layer: int, weights: torch.Tensor) -> None:
        """Add one layer's ``[1, heads, queries, keys]`` attention probabilities."""
        if not self.active:
            return
        if layer == 0:
            self.forwards += 1
        skip = self.skip_rows if self.forwards == 1 else 0
        m = weights[0, :, skip:, :].float().sum(dim=(0, 1)).cpu()  # m: [keys]
        if m.numel() > self.mass.numel():
            self.mass = F.pad(self.mass, (0, m.numel() - self.mass.numel()))
        self.mass[: m.numel()] += m


@dataclass
class DocumentAttribution:
    """One document's share of the attention and its most-attended passages.

    Attributes:
        share: fraction of the question and answer tokens' attention on prefix + documents that went to
            this document (0..1).
        token_mass: ``[doc_tokens]`` float32 attention mass per token (0 for tokens not kept by retention).
        passages: ``[(start, end, share)]``, most attended first: character offsets into the document's
            text (as normalised: NFC, LF line ends) and the share of the document's mass in that span.
    """

    share: float
    token_mass: torch.Tensor
    passages: list[tuple[int, int, float]] = field(default_factory=list)


@dataclass
class Attribution:
    """Shares of the attention paid by question and answer tokens: the prefix and each document (slot order)."""

    prefix: float
    documents: list[DocumentAttribution]


def attribute(mass: AttentionMass, segments: list[Segment], storage_positions: torch.Tensor,
              doc_lengths: list[int]) -> Attribution:
    """Group slot masses by segment.

    Args:
        segments: the linked layout; storage_positions: ``[slots]`` int64 layout position of each cache slot at
            link time (later slots, the answer's, count as neither prefix nor document).
        doc_lengths: tokens of each document (kept or not).
    """
    n = min(storage_positions.numel(), mass.mass.numel())
    seg = segment_ids(segments, storage_positions[:n])  # seg: [slots] index into segments
    m = mass.mass[:n]
    kinds = [s.kind for s in segments]
    prefix = float(sum(m[seg == i].sum() for i, k in enumerate(kinds) if k == "prefix"))
    docs, starts = [], [s for s in segments if s.kind == "document"]
    for j, s in enumerate(starts):
        sel = seg == segments.index(s)
        tm = torch.zeros(doc_lengths[j], dtype=torch.float32)
        tm[storage_positions[:n][sel] - s.start] = m[sel]
        docs.append(DocumentAttribution(0.0, tm))
    total = prefix + sum(float(d.token_mass.sum()) for d in docs)
    for d in docs:
        d.share = float(d.token_mass.sum()) / total if total > 0 else 0.0
    return Attribution(prefix / total if total > 0 else 0.0, docs)


def top_spans(token_mass: torch.Tensor, width: int = PASSAGE_TOKENS,
              count: int = PASSAGES_PER_DOCUMENT) -> list[tuple[int, int, float]]:
    """The ``count`` non-overlapping windows of ``width`` tokens with the most mass: ``[(first token,
    end token, share of the document's mass)]``, most attended first."""
    n = token_mass.numel()
    total = float(token_mass.sum())
    if n == 0 or total <= 0:
        return []
    w = min(width, n)
    sums = token_mass.unfold(0, w, 1).sum(dim=1)  # sums: [n - w + 1] mass of each window
    spans: list[tuple[int, int, float]] = []
    for i in torch.argsort(sums, descending=True, stable=True).tolist():
        if len(spans) == count:
            break
        if all(i + w <= a or i >= b for a, b, _ in spans):
            spans.append((i, i + w, float(sums[i]) / total))
    return spans


def char_passages(spans: list[tuple[int, int, float]], offsets: list[tuple[int, int]],
                  body_start: int, body_len: int) -> list[tuple[int, int, float]]:
    """Token spans as character offsets into a document's body text.

    Args:
        offsets: ``(start, end)`` character span of each token in the framed document text.
        body_start, body_len: where the body (the user's text) lies in the framed text.
    """
    out = []
    for a, b, share in spans:
        start = min(max(offsets[a][0] - body_start, 0), body_len)
        end = min(max(offsets[b - 1][1] - body_start, 0), body_len)
        if end > start:
            out.append((start, end, share))
    return out

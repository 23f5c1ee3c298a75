"""Link-token initialisation from documents (``train-links --link-init document``, issue 28 item 3).

Today's initialisation (``separator``) makes every link token the embedding of the paragraph separator
(:func:`kvlink_rag.linking.link_tokens.initial_link_tokens`). Here link token ``j`` of a slot starts as the mean, over
``n_docs`` training documents encoded alone by the frozen base model, of the last-layer hidden state of the
document's ``K - j``-th last token (so the link tokens start as "what comes at the end of a document"),
rescaled to the mean norm of the model's input embeddings (the hidden states live at another scale), plus
Gaussian noise of ``noise`` times that norm per coordinate / sqrt(hidden) (seeded), so the K tokens and the
slots differ. With ``slots`` S > 1, slot ``s`` averages the documents ``s, s + S, ...``.
"""

from __future__ import annotations

import torch

from kvlink_rag.engine import Engine
from kvlink_rag.types import Document


@torch.no_grad()
def _last_hidden(engine: Engine, doc: Document, k: int) -> torch.Tensor:
    """``[k, hidden]`` float32: the final hidden states of the document's last ``k`` tokens (encoded alone,
    positions from 0, every adapter off); a document shorter than ``k`` repeats its first token's state."""
    lm = engine.lm
    ids = engine.document_ids(doc)[None].to(lm.device)
    h = lm.decoder(input_ids=ids).last_hidden_state[0].float()  # [tokens, hidden]
    idx = torch.clamp(torch.arange(h.shape[0] - k, h.shape[0]), min=0)
    return h[idx].cpu()


def document_link_init(engine: Engine, docs: list[Document], k: int, slots: int = 1, noise: float = 0.02,
                       seed: int = 0) -> torch.Tensor:
    """Initial link embeddings ``[K, hidden]`` (``slots`` 1) or ``[slots, K, hidden]`` float32 (module docstring).

    Raises:
        ValueError: no documents, or fewer than ``slots``.
    """
    if len(docs) < max(1, slots):
        raise ValueError(f"--link-init document needs at least {max(1, slots)} documents, got {len(docs)}")
    lm = engine.lm
    emb = lm.embed_tokens.weight.detach().float()
    target = float(emb.norm(dim=-1).mean())
    states = torch.stack([_last_hidden(engine, d, k) for d in docs])  # [n, K, hidden]
    per_slot = torch.stack([states[s::slots].mean(0) for s in range(slots)])  # [S, K, hidden]
    per_slot = per_slot * (target / per_slot.norm(dim=-1, keepdim=True).clamp_min(1e-6))
    g = torch.Generator().manual_seed(seed)
    hidden = per_slot.shape[-1]
    per_slot = per_slot + noise * target / hidden ** 0.5 * torch.randn(per_slot.shape, generator=g)
    return per_slot[0] if slots == 1 else per_slot

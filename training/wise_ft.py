"""Weight-space interpolation of two link-token artifacts (WiSE-FT: Wortsman et al., 2022, "Robust fine-tuning of
zero-shot models", arXiv 2109.01903): ``(1 - weight) * base + weight * tuned`` for the link embeddings and every
LoRA tensor, so a continuation trained for one task (key-value retrieval) keeps part of its gain and part of the
base artifact's behaviour elsewhere, with no training. The LoRA factors A and B are interpolated each, as WiSE-FT
interpolates parameters; their product is then quadratic in ``weight``, close to linear where ``tuned`` continued
from ``base`` with a small step."""

from __future__ import annotations

import torch

from kvlink_rag.linking.link_tokens import LinkTokens, LinkTokensMismatch


def _check_pair(base: LinkTokens, tuned: LinkTokens) -> None:
    if base.model_fingerprint != tuned.model_fingerprint:
        raise LinkTokensMismatch(f"the artifacts were made for different models ({base.model_fingerprint[:12]} "
                                 f"and {tuned.model_fingerprint[:12]})")
    if base.embeds.shape != tuned.embeds.shape:
        raise LinkTokensMismatch(f"link embeddings differ in shape: {tuple(base.embeds.shape)} and "
                                 f"{tuple(tuned.embeds.shape)}")
    if bool(base.metadata.get("doc_side")) != bool(tuned.metadata.get("doc_side")):
        raise LinkTokensMismatch("one artifact's adapter runs on the documents too (doc_side), the other's not")
    if base.lora_config != tuned.lora_config or sorted(base.lora or {}) != sorted(tuned.lora or {}):
        raise LinkTokensMismatch(f"the LoRA adapters differ: {base.lora_config} and {tuned.lora_config}")
    for name, t in (base.lora or {}).items():
        if t.shape != tuned.lora[name].shape:
            raise LinkTokensMismatch(f"LoRA tensor {name} differs in shape: {tuple(t.shape)} and "
                                     f"{tuple(tuned.lora[name].shape)}")


def interpolate_link_tokens(base: LinkTokens, tuned: LinkTokens, weight: float,
                            parts: dict[str, float] | None = None) -> LinkTokens:
    """``(1 - w) * base + w * tuned``, tensor by tensor, computed in float32.

    Args:
        base, tuned: artifacts of one model with the same K, slots and LoRA (names, shapes, config).
        weight: ``w``, the share of ``tuned``, in [0, 1] (0 gives ``base``'s values, 1 ``tuned``'s).
        parts: other weights for some tensors: ``{substring: w}``, the first substring found in a tensor's name
            wins (LoRA names as peft's, ``model.layers.3.mlp.up_proj.lora_A.weight``; the embeddings are
            ``link_embeds``), e.g. ``{"mlp": 0.5}``.

    Returns:
        A new artifact: embeddings ``[K, hidden]`` or ``[S, K, hidden]`` float32, LoRA tensors in ``tuned``'s
        dtype, metadata naming both inputs (their identities) and the weight.

    Raises:
        ValueError: a weight outside [0, 1].
        LinkTokensMismatch: the two differ in model, shape or adapter.
    """
    parts = dict(parts or {})
    if bad := {k: w for k, w in {"weight": weight, **parts}.items() if not 0.0 <= w <= 1.0}:
        raise ValueError(f"weights must be in [0, 1], got {bad}")
    _check_pair(base, tuned)

    def mix(name: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        w = next((pw for part, pw in parts.items() if part in name), weight)
        return torch.lerp(a.detach().float(), b.detach().float(), w).to(b.dtype)

    lora = {n: mix(n, t, tuned.lora[n]) for n, t in base.lora.items()} if base.lora else None
    meta = {"trained": True, "init": "interpolated", "method": "WiSE-FT weight interpolation (arXiv 2109.01903)",
            "base": base.identity(), "tuned": tuned.identity(), "weight": weight, "parts": parts,
            **({"doc_side": True} if base.metadata.get("doc_side") else {})}  # how kvlink_rag.reuse serves it
    return LinkTokens(embeds=mix("link_embeds", base.embeds, tuned.embeds), model_fingerprint=base.model_fingerprint,
                      metadata=meta, lora=lora, lora_config=dict(base.lora_config) if base.lora_config else None)

"""LinkTokens.identity: the content hash is memoised per tensor state and follows in-place updates."""

from __future__ import annotations

import torch

from kvlink_rag.linking.link_tokens import LinkTokens


def _tokens(seed: int = 0) -> LinkTokens:
    g = torch.Generator().manual_seed(seed)
    lora = {"layers.0.q_proj.lora_A": torch.randn(4, 8, generator=g), "layers.0.q_proj.lora_B": torch.randn(8, 4, generator=g)}
    return LinkTokens(torch.randn(3, 8, generator=g), "fp", lora=lora, lora_config={"rank": 4, "alpha": 8})


def test_identity_is_the_same_for_equal_content_and_differs_for_other_content():
    assert _tokens(0).identity() == _tokens(0).identity()
    assert _tokens(0).identity() != _tokens(1).identity()
    assert len(_tokens(0).identity()) == 12


def test_an_in_place_update_of_the_embeddings_or_the_lora_changes_the_identity():
    lt = _tokens(0)
    first, saved = lt.identity(), lt.embeds.clone()
    lt.embeds.add_(1.0)  # an optimizer step updates in place
    second = lt.identity()
    assert second != first
    lt.embeds.copy_(saved)
    assert lt.identity() == first  # the content decides, not the history
    lt.lora["layers.0.q_proj.lora_B"].mul_(2.0)
    assert lt.identity() not in (first, second)


def test_a_replaced_tensor_changes_the_identity():
    lt = _tokens(0)
    first = lt.identity()
    lt.embeds = lt.embeds + 1.0
    assert lt.identity() != first

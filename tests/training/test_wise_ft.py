"""training/wise_ft.py: weight-space interpolation of two link-token artifacts."""

from __future__ import annotations

import pytest
import torch

from kvlink_rag.linking.link_tokens import LinkTokens, LinkTokensMismatch
from training.wise_ft import interpolate_link_tokens


def _art(embeds: list[float], a: list[float], fp: str = "fp", rank: int = 1) -> LinkTokens:
    lora = {"layers.0.q_proj.lora_A": torch.tensor([a], dtype=torch.bfloat16)}
    return LinkTokens(torch.tensor([embeds]), fp, {}, lora, {"rank": rank, "alpha": 2, "targets": ["q_proj"]})


def test_each_tensor_is_the_weighted_mean_of_the_two():
    base, tuned = _art([0.0, 4.0], [1.0, -1.0]), _art([2.0, 0.0], [3.0, 1.0])
    got = interpolate_link_tokens(base, tuned, 0.25)
    assert got.embeds.tolist() == [[0.5, 3.0]]
    assert got.lora["layers.0.q_proj.lora_A"].tolist() == [[1.5, -0.5]]
    assert got.lora["layers.0.q_proj.lora_A"].dtype == torch.bfloat16
    assert got.lora_config == base.lora_config and got.model_fingerprint == "fp"
    assert got.metadata["weight"] == 0.25 and got.metadata["base"] == base.identity()
    assert interpolate_link_tokens(base, tuned, 0.0).embeds.tolist() == [[0.0, 4.0]]
    assert interpolate_link_tokens(base, tuned, 1.0).lora["layers.0.q_proj.lora_A"].tolist() == [[3.0, 1.0]]


def test_mismatched_artifacts_and_weights_are_refused():
    base = _art([0.0, 4.0], [1.0, -1.0])
    with pytest.raises(ValueError, match="weights must be in \\[0, 1\\], got {'weight': 1.5}"):
        interpolate_link_tokens(base, base, 1.5)
    with pytest.raises(ValueError, match="got {'mlp': -0.5}"):
        interpolate_link_tokens(base, base, 0.5, {"mlp": -0.5})
    with pytest.raises(LinkTokensMismatch, match="different models"):
        interpolate_link_tokens(base, _art([0.0, 4.0], [1.0, -1.0], fp="other"), 0.5)
    with pytest.raises(LinkTokensMismatch, match="shape: \\(1, 2\\) and \\(1, 3\\)"):
        interpolate_link_tokens(base, _art([0.0, 4.0, 1.0], [1.0, -1.0]), 0.5)
    with pytest.raises(LinkTokensMismatch, match="LoRA adapters differ"):
        interpolate_link_tokens(base, _art([0.0, 4.0], [1.0, -1.0], rank=2), 0.5)


def test_parts_take_their_own_weight_first_match_wins():
    base, tuned = _art([0.0, 4.0], [1.0, -1.0]), _art([2.0, 0.0], [3.0, 1.0])
    got = interpolate_link_tokens(base, tuned, 0.5, {"q_proj": 1.0, "layers": 0.0, "link_embeds": 0.25})
    assert got.lora["layers.0.q_proj.lora_A"].tolist() == [[3.0, 1.0]]  # q_proj before layers
    assert got.embeds.tolist() == [[0.5, 3.0]] and got.metadata["parts"]["q_proj"] == 1.0
    assert interpolate_link_tokens(base, tuned, 0.5, {"mlp": 1.0}).lora["layers.0.q_proj.lora_A"].tolist() == \
        [[2.0, 0.0]]  # no part matches: the weight


def test_document_side_artifacts_stay_document_side_and_never_mix_with_query_side_ones():
    doc_a, doc_b = _art([0.0, 4.0], [1.0, -1.0]), _art([2.0, 0.0], [3.0, 1.0])
    doc_a.metadata["doc_side"] = doc_b.metadata["doc_side"] = True
    assert interpolate_link_tokens(doc_a, doc_b, 0.5).metadata["doc_side"] is True
    assert "doc_side" not in interpolate_link_tokens(_art([0.0, 4.0], [1.0, -1.0]), _art([2.0, 0.0], [3.0, 1.0]),
                                                     0.5).metadata
    with pytest.raises(LinkTokensMismatch, match="doc_side"):
        interpolate_link_tokens(doc_a, _art([2.0, 0.0], [3.0, 1.0]), 0.5)

"""Link-token files: round trip and model checks."""

import pytest
import torch

from factories import tiny_model
from kvlink_rag.links import LinkTokens, LinkTokensMismatch, load_link_tokens


def test_round_trip_and_fingerprint_check(tmp_path):
    lm = tiny_model("llama")
    lt = LinkTokens(torch.randn(5, lm.config.hidden_size), lm.fingerprint, {"steps": 10})
    lt.save(tmp_path / "l.safetensors")
    back = load_link_tokens(tmp_path / "l.safetensors", lm)
    assert torch.equal(back.embeds, lt.embeds) and back.k == 5 and back.metadata == {"steps": 10}
    other = tiny_model("llama", seed=1)
    with pytest.raises(LinkTokensMismatch, match="made for model"):
        load_link_tokens(tmp_path / "l.safetensors", other)
    LinkTokens(torch.randn(5, 8), lm.fingerprint).save(tmp_path / "narrow.safetensors")
    with pytest.raises(LinkTokensMismatch, match="expected \\[K, 256\\]"):
        load_link_tokens(tmp_path / "narrow.safetensors", lm)
    with pytest.raises(FileNotFoundError):
        load_link_tokens(tmp_path / "missing.safetensors", lm)

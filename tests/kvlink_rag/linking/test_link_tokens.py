"""Link-token files: round trip and model checks."""

import pytest
import torch

from factories import tiny_model
from kvlink_rag.linking.link_tokens import LinkTokens, LinkTokensMismatch, load_link_tokens


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


def test_shipped_artifact_for_another_model_is_skipped(tmp_path, monkeypatch):
    import kvlink_rag.linking.link_tokens as links

    lm = tiny_model("llama")
    monkeypatch.setattr(links, "ASSETS", tmp_path)
    LinkTokens(torch.randn(5, lm.config.hidden_size), "some-other-model").save(tmp_path / "other.safetensors")
    assert links.shipped_link_tokens(lm) is None
    mine = LinkTokens(torch.randn(4, lm.config.hidden_size), lm.fingerprint, {"trained": True})
    mine.save(tmp_path / "mine.safetensors")
    got = links.shipped_link_tokens(lm)
    assert got is not None and got.k == 4 and torch.equal(got.embeds, mine.embeds)

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


def test_read_without_a_model_keeps_stored_dtypes_and_refuses_a_file_without_embeddings(tmp_path):
    from safetensors.torch import save_file

    from kvlink_rag.linking.link_tokens import read_link_tokens

    lora = {"q.lora_A": torch.randn(4, 8)}
    LinkTokens(torch.randn(3, 8), "fp", {"steps": 2}, lora, {"rank": 4}).save(tmp_path / "a.safetensors")
    back = read_link_tokens(tmp_path / "a.safetensors")
    assert back.model_fingerprint == "fp" and back.k == 3 and back.lora_config == {"rank": 4}
    assert back.lora["q.lora_A"].dtype == torch.bfloat16
    assert torch.equal(back.lora["q.lora_A"], lora["q.lora_A"].to(torch.bfloat16))
    save_file({"other": torch.zeros(2)}, str(tmp_path / "b.safetensors"))
    with pytest.raises(LinkTokensMismatch, match="holds no 'link_embeds'"):
        read_link_tokens(tmp_path / "b.safetensors")

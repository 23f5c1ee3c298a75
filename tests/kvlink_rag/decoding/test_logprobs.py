"""Log-probabilities of sampled tokens: values of log_softmax, the top alternatives, a token's real bytes."""

from __future__ import annotations

import pytest
import torch

from factories import real_tokenizer
from kvlink_rag.decoding.logprobs import token_bytes, token_logprob


def test_token_logprob_is_log_softmax_with_the_top_alternatives_most_likely_first():
    logits = torch.tensor([1.0, 3.0, 2.0, -1.0], dtype=torch.bfloat16)
    lp = torch.log_softmax(logits.float(), dim=-1)
    e = token_logprob(logits, 2, top=2)
    assert e.token_id == 2 and e.logprob == pytest.approx(float(lp[2]))
    assert [t for t, _ in e.top] == [1, 2] and [v for _, v in e.top] == pytest.approx([float(lp[1]), float(lp[2])])
    assert token_logprob(logits, 0, top=0).top == ()
    with pytest.raises(ValueError, match="0..20"):
        token_logprob(logits, 0, top=21)


def test_token_bytes_give_a_byte_level_tokens_own_bytes_even_inside_a_character():
    tok = real_tokenizer()
    ids = tok("é€", add_special_tokens=False)["input_ids"]
    assert b"".join(token_bytes(tok, t) for t in ids) == "é€".encode()
    assert token_bytes(tok, tok(" Paris", add_special_tokens=False)["input_ids"][0]).startswith(b" P")

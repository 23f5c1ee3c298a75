"""Grammar masks (llguidance) over the real tokenizer: only tokens that keep the text valid JSON for the schema
survive, EOS only once it is complete; invalid response formats are refused with the reason."""

from __future__ import annotations

import json

import pytest
import torch

from factories import real_tokenizer
from kvlink_rag.decoding.grammar import InvalidGrammar, response_grammar

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}


def test_masked_greedy_decoding_of_random_logits_gives_json_valid_for_the_schema():
    tok = real_tokenizer()
    vocab = len(tok)
    m = response_grammar(tok, vocab, {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}).matcher()
    gen = torch.Generator().manual_seed(0)
    out: list[int] = []
    for _ in range(20):
        logits = torch.randn(vocab, generator=gen)
        logits[tok.eos_token_id] = 50.0  # the model "wants" to stop at once: the grammar forbids it until complete
        masked = m.mask(logits)
        assert masked.shape == (vocab,) and torch.isinf(masked).sum() > vocab // 2
        t = int(torch.argmax(masked))
        m.accept(t)
        if t == tok.eos_token_id:
            break
        out.append(t)
    assert m.finished
    value = json.loads(tok.decode(out))
    assert set(value) == {"n"} and isinstance(value["n"], int)


@pytest.mark.parametrize("spec, message", [
    ({"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}, "Invalid type: nonsense"),
    ({"type": "json_schema", "json_schema": {"schema": "{not json"}}, "invalid JSON schema"),
    ({"type": "json_schema", "json_schema": {"schema": [1]}}, "must be a JSON object"),
    ({"type": "json_schema"}, "needs json_schema"),
    ({"type": "grammar"}, "must be 'text', 'json_object' or 'json_schema'"),
])
def test_invalid_response_formats_are_refused_with_the_reason(spec, message):
    with pytest.raises(InvalidGrammar, match=message):
        response_grammar(real_tokenizer(), 49152, spec)

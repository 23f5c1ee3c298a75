"""Grammar-constrained decoding for OpenAI's ``response_format`` (``json_object``, ``json_schema``): each
decode step masks the logits to the tokens the grammar allows next, so the answer parses as JSON (valid for
the schema) whatever the model prefers.

Library: llguidance (Microsoft's, also a vLLM structured-output backend). Measured beside xgrammar 0.2.9 on
SmolLM2's tokenizer (vocabulary 49,152, one CPU thread, BENCHMARKS.md "Grammar-constrained decoding"): the
per-token mask plus its application cost about the same (~0.3 ms median, ~1 ms mean, both well under a decode
step), but llguidance compiles a new schema in ~2 ms against ~35 ms (it builds the lexer lazily), validates
schemas with readable messages, and its wheel has no dependencies, while xgrammar's pulls in triton (a GPU
compiler, hundreds of MB) and apache-tvm-ffi. One :class:`Grammar` per request (compiled once, shared by its
``n`` choices); each running request has its own :class:`GrammarMatcher` state.

JSON is generated compact (no optional whitespace: ``whitespace_flexible`` off, so a small model cannot run
away in blanks); a schema may turn it on with ``"x-guidance": {"whitespace_flexible": true}``.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import torch

JSON_DEFAULTS = {"whitespace_flexible": False}
_BITS = torch.arange(32, dtype=torch.int32)
MAX_SCHEMA_CHARS = 100_000


class InvalidGrammar(ValueError):
    """A ``response_format`` that is no valid JSON schema (or that llguidance cannot compile); the message says why."""


class Grammar:
    """A compiled grammar (an llguidance grammar over one tokenizer); :meth:`matcher` starts a fresh state.

    Args:
        tokenizer: the llguidance tokenizer (:func:`ll_tokenizer`).
        grammar: the llguidance grammar text.
        vocab: the model's logit width (tokens >= the tokenizer's size are always masked).
    """

    def __init__(self, tokenizer, grammar: str, vocab: int):
        self.tokenizer, self.grammar, self.vocab = tokenizer, grammar, vocab

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self)


class GrammarMatcher:
    """One request's position in its grammar: :meth:`mask` the next logits, :meth:`accept` the token sampled.

    The allowed-token bitmask (``[ceil(V / 32)]`` int32, bit ``i % 32`` of word ``i // 32`` set when token
    ``i`` is allowed) is filled by llguidance and unpacked here in eager torch; llguidance's own
    ``llguidance.torch`` helper is not used: it is ``torch.compile``d, which costs ~10-25 s on its first call
    (measured here, in the scheduler's step under the model lock).
    """

    def __init__(self, grammar: Grammar):
        import llguidance

        self._m = llguidance.LLMatcher(grammar.tokenizer, grammar.grammar)
        self._words = torch.full(((grammar.tokenizer.vocab_size + 31) // 32,), -1, dtype=torch.int32)
        self.vocab = grammar.vocab

    def allowed(self) -> torch.Tensor:
        """``[vocab]`` bool: the tokens the grammar allows next.

        Raises:
            RuntimeError: the matcher is in an error state (a token it had not allowed was accepted).
        """
        if self._m.is_error():
            raise RuntimeError(f"grammar matcher failed: {self._m.get_error()}")
        self._m.unsafe_compute_mask_ptr(self._words.data_ptr(), self._words.numel() * 4)
        bits = (self._words.unsqueeze(1) >> _BITS) & 1  # [words, 32]
        allowed = bits.reshape(-1).bool()
        if allowed.numel() >= self.vocab:
            return allowed[: self.vocab]
        return torch.cat([allowed, torch.zeros(self.vocab - allowed.numel(), dtype=torch.bool)])

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """``[vocab]`` float32 logits (a CPU copy) with every token the grammar forbids next at ``-inf``.

        Raises:
            RuntimeError: as :meth:`allowed`.
        """
        out = logits.detach().float().cpu().reshape(-1)
        return out.masked_fill(~self.allowed(), float("-inf"))

    def accept(self, token_id: int) -> None:
        """Advance past ``token_id`` (the one sampled from the masked logits; EOS ends the grammar)."""
        self._m.consume_token(int(token_id))

    @property
    def finished(self) -> bool:
        """Whether the grammar accepts nothing more (it ended with EOS, or cannot be extended)."""
        return self._m.is_stopped()


_TOKENIZERS: dict[int, Any] = {}
_LOCK = threading.Lock()


def ll_tokenizer(tokenizer, vocab: int, eos: int | None):
    """The llguidance tokenizer of a Hugging Face one (built once per tokenizer, ~1-2 s; cached)."""
    import llguidance.hf

    with _LOCK:
        key = id(tokenizer)
        if key not in _TOKENIZERS:
            _TOKENIZERS[key] = (tokenizer, llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=eos))
        return _TOKENIZERS[key][1]


def response_grammar(tokenizer, vocab: int, spec: dict) -> Grammar:
    """The grammar of an OpenAI ``response_format`` ``spec``: ``{"type": "json_object"}`` (any JSON object) or
    ``{"type": "json_schema", "json_schema": {"schema": {...}, "name"?, "strict"?}}`` (``schema`` may be its
    JSON text). EOS is the tokenizer's (the answer's end once the JSON is complete).

    Raises:
        InvalidGrammar: an unknown type, a missing or invalid schema (the message names what is wrong).
    """
    import llguidance

    kind = spec.get("type")
    if kind == "json_object":
        schema: Any = {"type": "object"}
    elif kind == "json_schema":
        inner = spec.get("json_schema")
        if not isinstance(inner, dict) or "schema" not in inner:
            raise InvalidGrammar("response_format json_schema needs json_schema: {name, schema: {...}}")
        schema = inner["schema"]
    else:
        raise InvalidGrammar(f"response_format type must be 'text', 'json_object' or 'json_schema'; got {kind!r}")
    text = schema if isinstance(schema, str) else json.dumps(schema)
    if len(text) > MAX_SCHEMA_CHARS:
        raise InvalidGrammar(f"the JSON schema has {len(text)} characters; the limit is {MAX_SCHEMA_CHARS}")
    try:
        if not isinstance(json.loads(text), dict):
            raise InvalidGrammar("the JSON schema must be a JSON object")
        grammar = llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_DEFAULTS)
    except ValueError as e:
        raise InvalidGrammar(f"invalid JSON schema: {e}") from None
    ll_tok = ll_tokenizer(tokenizer, vocab, tokenizer.eos_token_id)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, ll_tok)
    if is_error:
        raise InvalidGrammar(f"invalid JSON schema: {messages[0] if messages else 'rejected by llguidance'}")
    return Grammar(ll_tok, grammar, vocab)

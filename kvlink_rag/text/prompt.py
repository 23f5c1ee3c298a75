"""Prompt framing with the model's chat template, split into separately tokenised segments.

Every segment (anchor prefix, each document, question) is tokenised alone with
``add_special_tokens=False``, and a prompt is the concatenation of the segments' ids. So a document
has the same ids alone and inside any layout, and full prefill and linked reuse see the same tokens.

Only the template adds special tokens: user text (document body, title, question) is tokenised as plain
text (:func:`encode_user_text`), so ``<|im_end|>`` typed by a user is the characters ``<``, ``|``, ...,
never the end-of-turn token. For text without special-token strings the ids are the same as a normal
tokenisation (checked on all 2,000 NQ-open dev passages and questions), so stored caches stay valid.
"""

from __future__ import annotations

import copy
import threading
import weakref
from dataclasses import dataclass

import torch

from ..encodable import normalize_text

_SENTINEL = "\u2063KVLINK_USER_CONTENT\u2063"


_USER_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_USER_LOCK = threading.Lock()


def _encode(tokenizer, text: str) -> torch.Tensor:
    """Template text: special-token strings in it become their special ids."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.long)


def special_ids(tokenizer) -> frozenset[int]:
    """Ids of the tokenizer's special tokens (named ones and added tokens marked special), less the unknown
    token (plain text may map to it)."""
    ids = set(getattr(tokenizer, "all_special_ids", None) or ())
    for i, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    ids.discard(getattr(tokenizer, "unk_token_id", None))
    return frozenset(ids)


def _special_strings(tokenizer) -> tuple[str, ...]:
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return tuple(t.content for t in decoder.values() if getattr(t, "special", False) and t.content)


def _user_tokenizer(tokenizer):
    """A private copy of ``tokenizer`` with ``split_special_tokens=True`` (one per tokenizer), the
    original's special ids and special-token strings.

    A copy rather than a per-call flag: HF fast tokenizers apply the flag by mutating their shared Rust
    tokenizer, which would race with template tokenisation on another thread.
    """
    with _USER_LOCK:
        entry = _USER_TOKENIZERS.get(tokenizer)
        if entry is None:
            user = copy.deepcopy(tokenizer)
            user.split_special_tokens = True
            entry = _USER_TOKENIZERS[tokenizer] = (user, special_ids(tokenizer), _special_strings(tokenizer))
        return entry


def encode_user_text(tokenizer, text: str) -> torch.Tensor:
    """``[tokens]`` int64 ids of user-supplied ``text`` as plain text: no special token is ever matched.

    Raises:
        ValueError: the tokenizer still produced a special id (it ignores ``split_special_tokens``).
    """
    user, special, _ = _user_tokenizer(tokenizer)
    ids = user(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    if special.intersection(ids):
        raise ValueError("the tokenizer matches special tokens inside user text (split_special_tokens is not "
                         "supported), and the text contains one")
    return torch.tensor(ids, dtype=torch.long)


def user_text_offsets(tokenizer, text: str) -> list[tuple[int, int]]:
    """Character span ``(start, end)`` in ``text`` of each token of :func:`encode_user_text` (a fast
    tokenizer's offset mapping; same ids, one span per id).

    Raises:
        ValueError: the tokenizer gives no offsets (not a fast tokenizer).
    """
    user, _, _ = _user_tokenizer(tokenizer)
    try:
        enc = user(text, add_special_tokens=False, split_special_tokens=True, return_offsets_mapping=True)
    except NotImplementedError as e:
        raise ValueError(f"the tokenizer gives no character offsets: {e}") from None
    return [(int(a), int(b)) for a, b in enc["offset_mapping"]]


def has_special_text(tokenizer, text: str) -> bool:
    """Whether ``text`` contains the string of a special token (its ids differ from those of the old,
    special-matching tokenisation, so its cache key must too)."""
    return any(s in text for s in _user_tokenizer(tokenizer)[2])


@dataclass(frozen=True)
class PromptTemplate:
    """Splits a chat prompt into ``[prefix][documents...][question + assistant header]``.

    Attributes:
        prefix_text: system turn plus the user-turn header and the instruction (the anchor prefix).
        suffix_text: end of the user turn and the assistant header (after the question).
    """

    prefix_text: str
    suffix_text: str

    @classmethod
    def from_tokenizer(cls, tokenizer, system_prompt: str) -> "PromptTemplate":
        """Render the chat template around a sentinel user message and cut there.

        Falls back to a plain ``system\\n\\n ... Answer:`` frame for tokenizers without a chat template.
        """
        if getattr(tokenizer, "chat_template", None):
            msgs = [{"role": "system", "content": system_prompt}, {"role": "user", "content": _SENTINEL}]
            text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            before, after = text.split(_SENTINEL)
            return cls(prefix_text=before, suffix_text=after)
        return cls(prefix_text=system_prompt + "\n\n", suffix_text="\nAnswer:")

    def prefix_ids(self, tokenizer) -> torch.Tensor:
        """``[prefix_tokens]`` int64."""
        return _encode(tokenizer, self.prefix_text)

    @staticmethod
    def document_text(text: str, title: str | None = None, framed: bool = True) -> str:
        """How a document appears in the prompt (no slot number: the text must not depend on its slot); not
        ``framed``: its text alone (a chunk continuing the one before it, ``chunk_frames`` 'first')."""
        body = normalize_text(text)
        if not framed:
            return f"{body}\n\n"
        if title and title.strip():
            return f"Document (Title: {normalize_text(title)}) {body}\n\n"
        return f"Document: {body}\n\n"

    def document_ids(self, tokenizer, text: str, title: str | None = None, framed: bool = True) -> torch.Tensor:
        """``[doc_tokens]`` int64 ids of one document, tokenised alone (``framed``: see :meth:`document_text`).

        Raises:
            ValueError: empty document text.
        """
        if not text or not text.strip():
            raise ValueError("document text is empty")
        return encode_user_text(tokenizer, self.document_text(text, title, framed))

    def question_ids(self, tokenizer, question: str) -> torch.Tensor:
        """``[question_tokens]`` int64: the question (plain text) and the assistant header (template).

        The two parts are tokenised apart; the chat template's suffix starts with a special token, so the
        ids equal those of the joined text for ordinary questions.

        Raises:
            ValueError: empty question.
        """
        if not question or not question.strip():
            raise ValueError("question is empty")
        user = encode_user_text(tokenizer, f"Question: {question.strip()}")
        return torch.cat([user, _encode(tokenizer, self.suffix_text)])

    def min_question_tokens(self, tokenizer) -> int:
        """A lower bound on :meth:`question_ids`' length: ``"Question:"``, one token of question text and
        the assistant header."""
        header = int(encode_user_text(tokenizer, "Question:").numel())
        return header + 1 + int(_encode(tokenizer, self.suffix_text).numel())

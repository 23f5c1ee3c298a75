"""Prompt framing with the model's chat template, split into separately tokenised segments.

Every segment (anchor prefix, each document, question) is tokenised alone with
``add_special_tokens=False``, and a prompt is the concatenation of the segments' ids. So a document
has the same ids alone and inside any layout, and full prefill and linked reuse see the same tokens.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import torch

_SENTINEL = "\u2063KVLINK_USER_CONTENT\u2063"


def normalize_text(text: str) -> str:
    """NFC-normalise, turn CRLF/CR into LF, strip the ends.

    Only changes that keep the meaning: the normalised text is exactly what is tokenised and what the
    content hash covers, so equal hashes mean equal token ids.
    """
    return unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n").strip()


def _encode(tokenizer, text: str) -> torch.Tensor:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.long)


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
    def document_text(text: str, title: str | None = None) -> str:
        """How a document appears in the prompt (no slot number: the text must not depend on its slot)."""
        body = normalize_text(text)
        if title and title.strip():
            return f"Document (Title: {normalize_text(title)}) {body}\n\n"
        return f"Document: {body}\n\n"

    def document_ids(self, tokenizer, text: str, title: str | None = None) -> torch.Tensor:
        """``[doc_tokens]`` int64 ids of one document, tokenised alone.

        Raises:
            ValueError: empty document text.
        """
        if not text or not text.strip():
            raise ValueError("document text is empty")
        return _encode(tokenizer, self.document_text(text, title))

    def question_ids(self, tokenizer, question: str) -> torch.Tensor:
        """``[question_tokens]`` int64: the question and the assistant header.

        Raises:
            ValueError: empty question.
        """
        if not question or not question.strip():
            raise ValueError("question is empty")
        return _encode(tokenizer, f"Question: {question.strip()}" + self.suffix_text)

"""A multi-turn conversation as the ids that follow the documents, framed by the model's chat template.

The first user turn is framed exactly as a question (:meth:`PromptTemplate.question_ids`), so a one-turn
chat is the same prompt as a query. Later turns reuse the template's own separators, cut from a rendered
conversation with sentinel contents: after an assistant answer comes the end of its turn and the next
user header; after a user message, the end of the user turn and the assistant header. Message contents
are user text (never parsed for special tokens). System messages are the service's own system prompt
(in the prefix the documents were encoded after); a client's system messages are placed before the
first question, so changing them never invalidates stored caches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .prompt import PromptTemplate, _encode, encode_user_text

ROLES = ("system", "user", "assistant")
_S = ("\u2063KVLINK_A\u2063", "\u2063KVLINK_B\u2063", "\u2063KVLINK_C\u2063")


class InvalidConversation(ValueError):
    """The message list cannot be framed (no user message, unknown role, turns out of order)."""


@dataclass(frozen=True)
class Turn:
    """One message: ``role`` in :data:`ROLES` and its text."""

    role: str
    text: str


def _after_answer(tokenizer) -> str:
    """Template text between an assistant answer and the next user message's content."""
    if not getattr(tokenizer, "chat_template", None):
        return "\nQuestion: "
    msgs = [{"role": "user", "content": _S[0]}, {"role": "assistant", "content": _S[1]},
            {"role": "user", "content": _S[2]}]
    text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    return text.split(_S[1])[1].split(_S[2])[0]


def check_turns(turns: list[Turn]) -> list[Turn]:
    """The turns without system messages, once the list is valid.

    Raises:
        InvalidConversation: unknown role, no user message, an empty user message, the last non-system
            message not from the user, or two turns of the same role in a row.
    """
    for t in turns:
        if t.role not in ROLES:
            raise InvalidConversation(f"unknown role {t.role!r}; roles are {', '.join(ROLES)}")
    talk = [t for t in turns if t.role != "system"]
    if not any(t.role == "user" for t in talk):
        raise InvalidConversation("messages must contain a user message (the question)")
    if talk[0].role != "user" or talk[-1].role != "user":
        raise InvalidConversation("after any system messages, the conversation must start with a user message "
                                  "and end with one")
    for a, b in zip(talk, talk[1:]):
        if a.role == b.role:
            raise InvalidConversation(f"two {a.role} messages in a row; user and assistant turns alternate")
    if any(not t.text.strip() for t in talk if t.role == "user"):
        raise InvalidConversation("a user message is empty")
    return talk


def conversation_ids(template: PromptTemplate, tokenizer, turns: list[Turn]) -> torch.Tensor:
    """``[tokens]`` int64 ids of the conversation after the documents, ending with the assistant header.

    Raises:
        InvalidConversation: see :func:`check_turns`.
    """
    talk = check_turns(turns)
    system = "\n\n".join(t.text.strip() for t in turns if t.role == "system" and t.text.strip())
    first = talk[0].text.strip()
    if system:  # the client's instructions, then the question framed as question_ids frames it
        first_ids = torch.cat([encode_user_text(tokenizer, f"{system}\n\nQuestion: {first}"),
                               _encode(tokenizer, template.suffix_text)])
    else:
        first_ids = template.question_ids(tokenizer, first)
    parts = [first_ids]
    sep = _encode(tokenizer, _after_answer(tokenizer))
    for t in talk[1:]:
        if t.role == "assistant":
            parts.append(encode_user_text(tokenizer, t.text.strip()))
        else:
            parts += [sep, encode_user_text(tokenizer, t.text.strip()), _encode(tokenizer, template.suffix_text)]
    return torch.cat(parts)

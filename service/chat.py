"""Chat messages as the service takes them: ``(role, text)`` pairs from a front end become the core's
conversation turns here, so the API never imports the core's conversation module."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from service.errors import ServiceError

if TYPE_CHECKING:
    from kvlink_rag.engine import Engine
    from kvlink_rag.text.conversation import Turn


def turns(messages: Iterable[tuple[str, str]]) -> list[Turn]:
    """The conversation turns of ``(role, text)`` messages, in order (checked by
    :meth:`service.queries.QueryService.plan_chat`)."""
    from kvlink_rag.text.conversation import Turn

    return [Turn(role, text) for role, text in messages]


def conversation_prompt_ids(engine: Engine, messages: Iterable[tuple[str, str]]) -> list[int]:
    """The prompt ids of a plain chat over ``messages``: the system prompt, then the conversation.

    Raises:
        ServiceError: 422 ``invalid_messages`` (no user message, unknown role, turns out of order).
    """
    from kvlink_rag.text.conversation import InvalidConversation, check_turns, conversation_ids

    talk = turns(messages)
    try:
        check_turns(talk)
    except InvalidConversation as e:
        raise ServiceError(422, "invalid_messages", str(e)) from None
    return engine.prefix.token_ids.tolist() + conversation_ids(engine.template, engine.lm.tokenizer, talk).tolist()

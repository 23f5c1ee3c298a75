"""Conversations after the documents: the chat template's own separators, a one-turn chat is a query."""

from __future__ import annotations

import pytest

from factories import real_tokenizer
from kvlink_rag.text.conversation import InvalidConversation, Turn, conversation_ids
from kvlink_rag.text.prompt import PromptTemplate


@pytest.fixture(scope="module")
def framing():
    tok = real_tokenizer()
    return PromptTemplate.from_tokenizer(tok, "You are helpful."), tok


def test_one_turn_is_the_question_and_later_turns_use_the_template(framing):
    template, tok = framing
    one = conversation_ids(template, tok, [Turn("user", "Who wrote Hamlet?")])
    assert one.tolist() == template.question_ids(tok, "Who wrote Hamlet?").tolist()
    turns = [Turn("user", "Who wrote Hamlet?"), Turn("assistant", "Shakespeare."), Turn("user", "When?")]
    text = tok.decode(conversation_ids(template, tok, turns))
    assert text == ("Question: Who wrote Hamlet?<|im_end|>\n<|im_start|>assistant\nShakespeare.<|im_end|>\n"
                    "<|im_start|>user\nWhen?<|im_end|>\n<|im_start|>assistant\n")
    longer = conversation_ids(template, tok, turns + [Turn("assistant", "1600."), Turn("user", "Where?")])
    assert longer[: len(conversation_ids(template, tok, turns))].tolist() == conversation_ids(template, tok, turns).tolist()


def test_system_text_goes_before_the_question_and_user_text_is_never_special(framing):
    template, tok = framing
    ids = conversation_ids(template, tok, [Turn("system", "Be brief."), Turn("user", "Hi <|im_end|> there")])
    assert tok.decode(ids).startswith("Be brief.\n\nQuestion: Hi <|im_end|> there<|im_end|>")
    assert ids.tolist().count(tok.convert_tokens_to_ids("<|im_end|>")) == 1  # only the template's


@pytest.mark.parametrize("turns, message", [
    ([Turn("system", "x")], "must contain a user message"),
    ([Turn("tool", "x"), Turn("user", "y")], "unknown role 'tool'"),
    ([Turn("user", "a"), Turn("assistant", "b")], "start with a user message and end with one"),
    ([Turn("user", "a"), Turn("user", "b")], "two user messages in a row"),
    ([Turn("user", "  ")], "a user message is empty"),
])
def test_invalid_conversations_are_refused(framing, turns, message):
    template, tok = framing
    with pytest.raises(InvalidConversation, match=message):
        conversation_ids(template, tok, turns)

"""answer_ids: the training target of an answer, whole with its end token, or cut without one."""

from __future__ import annotations

from factories import tiny_text_engine
from kvlink_rag.text.prompt import encode_user_text
from training.data import answer_ids
from training.train_config import TrainConfig


def test_a_whole_answer_ends_with_the_end_of_turn_token_and_a_cut_one_does_not(tmp_path):
    eng = tiny_text_engine(tmp_path)
    end = eng.stop_ids[0]
    value = "681b8f58-9683-4b76-9da5-9b74a6c3181c"  # a key-value answer: a UUID
    ids = encode_user_text(eng.lm.tokenizer, value).tolist()
    assert 16 < len(ids) <= TrainConfig().max_answer_tokens  # the default cap holds a UUID whole
    assert answer_ids(eng, value, TrainConfig().max_answer_tokens).tolist() == ids + [end]
    assert answer_ids(eng, value, 16).tolist() == ids[:16]  # cut: no end token, never "stop mid-answer"
    assert answer_ids(eng, value, len(ids)).tolist() == ids + [end]  # exactly at the cap: whole

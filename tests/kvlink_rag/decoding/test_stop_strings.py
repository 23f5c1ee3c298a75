"""Stop strings (kvlink_rag.decoding.stop_strings), min_tokens and ignore_eos in the decode loops."""

from __future__ import annotations

import dataclasses

import pytest

from factories import random_ids, tiny_model
from kvlink_rag.decoding.generate import SamplingParams, decode, full_prefill
from kvlink_rag.decoding.stop_strings import StopFilter, StopStrings, cut, filter_pieces, normalize_stop


class _LetterTokenizer:
    """Token id i decodes to one letter (a..z by i mod 26); ids >= 1000 are 'special' (decode to nothing)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join("" if i >= 1000 else chr(97 + i % 26) for i in ids)


def test_stop_is_normalised_and_bad_values_are_refused():
    assert normalize_stop(None) == normalize_stop("") == normalize_stop([]) == ()
    assert normalize_stop("\n") == ("\n",) and normalize_stop(["a", "b", "a"]) == ("a", "b")
    for bad, message in ((["x", ""], "must not be empty"), (["s"] * 17, "at most 16"), (["x" * 257], "256"),
                         ([1], "string")):
        with pytest.raises(ValueError, match=message):
            normalize_stop(bad)


def test_cut_ends_before_the_earliest_stop_string():
    assert cut("Paris. And Rome\nLondon", ("\n", ".")) == "Paris"
    assert cut("no stop here", ("\n",)) == "no stop here" and cut("abc", ()) == "abc"


@pytest.mark.parametrize("text,stops,expected", [("Hello\nWorld", ("\n",), "Hello"),
                                                  ("say END now END", ("END",), "say "),
                                                  ("abcab", ("abd",), "abcab"),  # a partial match let go at the end
                                                  ("xxENDyy", ("NDy", "END"), "xx")])
def test_a_filtered_stream_equals_the_cut_text_however_it_is_split(text, stops, expected):
    for size in range(1, len(text) + 1):
        pieces = [text[i:i + size] for i in range(0, len(text), size)]
        out = list(filter_pieces(pieces, stops))
        assert "".join(out) == expected == cut(text, stops), (size, out)


def test_the_filter_holds_back_a_possible_start_of_a_stop_string():
    f = StopFilter(("</answer>",))
    assert f.feed("42 </ans") == "42 " and f.held == "</ans"
    assert f.feed("wer> tail") == "" and f.stopped and f.flush() == ""
    g = StopFilter(("</answer>",))
    assert g.feed("a <") == "a " and g.feed("b") == "<b" and g.flush() == ""


def test_the_hook_fires_on_the_token_completing_a_stop_string_even_across_skipped_specials():
    hook = StopStrings(_LetterTokenizer(), ("cd",))
    assert [hook.push(t) for t in (0, 1, 2, 1000, 3, 4)] == [False, False, False, False, True, True]
    assert StopStrings.of(_LetterTokenizer(), ()) is None


def _lm():
    lm = tiny_model("llama")
    lm.tokenizer = _LetterTokenizer()
    return lm


def test_decode_stops_after_the_token_completing_a_stop_string():
    lm = _lm()
    params = SamplingParams(max_new_tokens=12)
    free = list(decode(lm, full_prefill(lm, random_ids(12, 0)), params))
    text = lm.tokenizer.decode(free)
    stop = text[5:7]
    first = text.find(stop)  # the token ending the first occurrence is the last one generated
    ctx = full_prefill(lm, random_ids(12, 0))
    stopped = list(decode(lm, ctx, dataclasses.replace(params, stop=(stop,))))
    assert stopped == free[: first + 2] and ctx.finish_reason == "stop"
    assert cut(lm.tokenizer.decode(stopped), (stop,)) == text[:first]


def test_min_tokens_keeps_stop_tokens_out_until_reached():
    lm = _lm()
    free = list(decode(lm, full_prefill(lm, random_ids(12, 0)), SamplingParams(max_new_tokens=8)))
    stop_ids = (free[1],)
    early = list(decode(lm, full_prefill(lm, random_ids(12, 0)), SamplingParams(max_new_tokens=8, stop_token_ids=stop_ids)))
    assert early == free[: free.index(stop_ids[0])]  # the stop token ends it at once
    held = list(decode(lm, full_prefill(lm, random_ids(12, 0)),
                       SamplingParams(max_new_tokens=8, stop_token_ids=stop_ids, min_tokens=5)))
    assert len(held) >= 5 and stop_ids[0] not in held[:5] and held[: len(early)] == early

"""Values every encoder accepts: lone surrogates, non-finite numbers and too deep nesting found and sanitised."""

from kvlink_rag.encodable import MAX_DEPTH, find_unencodable, sanitised, text_problem


def test_text_problem_names_the_first_lone_surrogate():
    assert text_problem("fine 日本 😀") is None
    assert text_problem("ab\ud800c\udfff") == "lone surrogate U+D800 at character 2 (not valid Unicode text)"
    assert text_problem("\udc80") == "lone surrogate U+DC80 at character 0 (not valid Unicode text)"


def test_find_unencodable_names_where_in_nested_values():
    assert find_unencodable({"a": [1, 2.5, "x", {"b": None}], "ok": True}, "metadata") is None
    assert find_unencodable({"a": [1, {"b": "\ud800"}]}, "metadata") == (
        "metadata.a.1.b", "lone surrogate U+D800 at character 0 (not valid Unicode text)")
    assert find_unencodable({"k\udfff": 1}, "metadata") == (
        "metadata", "key 'k\\udfff': lone surrogate U+DFFF at character 1 (not valid Unicode text)")
    assert find_unencodable([float("inf")], "x") == ("x.0", "inf is not a JSON number (NaN and infinities are not allowed)")
    deep: object = 1
    for _ in range(MAX_DEPTH):
        deep = [deep]
    assert find_unencodable(deep) is None and find_unencodable([deep])[1].startswith("nested deeper than 32")


def test_sanitised_is_accepted_and_keeps_what_was_fine():
    value = {"t\ud800": ["a\udfffb", float("nan"), 3, "日本"], "n": {"m": -float("inf")}}
    assert sanitised(value) == {"t\ufffd": ["a\ufffdb", None, 3, "日本"], "n": {"m": None}}
    deep: object = "x"
    for _ in range(MAX_DEPTH + 5):
        deep = {"a": deep}
    cut = sanitised(deep)
    assert find_unencodable(cut) is None and find_unencodable(deep) is not None
    assert sanitised({"a": [1, "b"]}) == {"a": [1, "b"]}

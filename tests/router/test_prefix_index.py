from router.prefix_index import PrefixIndex


def test_match_counts_whole_blocks_of_the_longest_prefix_seen_per_replica():
    idx = PrefixIndex(block=4, max_blocks=100)
    idx.insert("a", "abcdefghij")
    idx.insert("b", "abcdXXXX")
    assert idx.match("abcdefgh-zz") == {"a": 8, "b": 4}
    idx.forget("a")
    assert idx.match("abcdefgh") == {"b": 4}


def test_old_blocks_are_forgotten_past_the_bound():
    idx = PrefixIndex(block=2, max_blocks=2)
    idx.insert("a", "aabbcc")
    assert idx.match("aabbcc") == {"a": 0}  # the first block was forgotten

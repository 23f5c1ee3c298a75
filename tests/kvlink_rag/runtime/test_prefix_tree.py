"""The prefix tree: longest-prefix matches as views, splits, pins and LRU eviction within a byte budget."""

from __future__ import annotations

import torch

from kvlink_rag.runtime.prefix_tree import PrefixTree
from kvlink_rag.runtime.ragged import KVChunk


def kv(tokens: int, fill: float) -> KVChunk:
    # keys, values: [layers=2, kv_heads=1, tokens, head_dim=4]; 64 bytes per token (float32)
    t = torch.full((2, 1, tokens, 4), fill)
    return KVChunk(t + torch.arange(tokens).view(1, 1, -1, 1), t.clone())


def test_match_returns_the_stored_prefix_and_diverging_inserts_split_without_copies():
    tree = PrefixTree(1 << 20)
    a = kv(5, 1.0)
    assert tree.insert("ctx", [1, 2, 3, ("doc", "k"), 9], [1, 1, 1, 1, 1], a) == 5
    m = tree.match("ctx", [1, 2, 3, ("doc", "k"), 7])
    assert (m.items, m.tokens) == (4, 4)
    assert torch.equal(torch.cat([c.keys for c in m.chunks], 2), a.keys[:, :, :4])
    assert m.chunks[0].keys.data_ptr() == a.keys.data_ptr()  # a view of the stored tensor
    tree.release(m)
    assert tree.insert("ctx", [1, 2, 8, 8], [1, 1, 1, 1], kv(2, 2.0), kv_from=2) == 2  # splits after [1, 2]
    m2 = tree.match("ctx", [1, 2, 8, 8, 5])
    assert (m2.items, [c.num_tokens for c in m2.chunks]) == (4, [2, 2])
    assert float(m2.chunks[1].values[0, 0, 0, 0]) == 2.0
    m3 = tree.match("ctx", [1, 2, 3, ("doc", "k"), 9])  # the older branch survives the split
    assert m3.tokens == 5
    assert tree.match("other", [1, 2]).tokens == 0  # another adapter / mode never matches


def test_unpinned_leaves_are_evicted_least_recently_used_and_pinned_ones_stay():
    tree = PrefixTree(3 * 4 * 64)  # room for 12 tokens
    tree.insert("c", [1, 2, 3, 4], [1] * 4, kv(4, 1.0))
    tree.insert("c", [5, 6, 7, 8], [1] * 4, kv(4, 2.0))
    pinned = tree.match("c", [5, 6, 7, 8])
    tree.insert("c", [9, 10, 11, 12], [1] * 4, kv(4, 3.0))
    tree.insert("c", [13, 14, 15, 16], [1] * 4, kv(4, 4.0))  # over budget: the LRU unpinned leaf goes
    assert tree.match("c", [1, 2, 3, 4]).tokens == 0 and tree.match("c", [5, 6, 7, 8]).tokens == 4
    assert tree.nbytes <= tree.budget_bytes and tree.stats()["evicted_bytes"] == 4 * 64
    tree.release(pinned)


def test_a_zero_budget_stores_nothing():
    tree = PrefixTree(0)
    assert tree.insert("c", [1, 2], [1, 1], kv(2, 1.0)) == 0 and tree.match("c", [1, 2]).tokens == 0

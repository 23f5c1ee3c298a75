"""A request's KV in pool blocks: writes across blocks, runs, chunks lent to the prefix tree without copies,
references given back."""

from __future__ import annotations

import torch

from kvlink_rag.runtime.block_pool import BlockPool
from kvlink_rag.runtime.kv_sequence import KVChunk, SequenceKV
from kvlink_rag.runtime.prefix_tree import PrefixTree


def tokens(n: int, start: int = 0) -> torch.Tensor:
    """``[layers 2, kv_heads 1, n, head_dim 3]`` whose values name the token."""
    return torch.arange(start, start + n, dtype=torch.float32).view(1, 1, n, 1).expand(2, 1, n, 3).clone()


def test_own_tokens_across_scattered_blocks_read_back_in_order():
    pool = BlockPool(2, 1, 3, torch.float32, block_size=4, arena_blocks=8, max_blocks=8)
    hole = pool.allocate(8)
    pool.decref(hole[1::2])  # free blocks 1, 3, 5, 7: no two consecutive
    seq = SequenceKV([], 2, 1, 3, torch.float32, capacity=10, pool=pool)
    seq.append(tokens(10), -tokens(10))
    assert seq.table == [1, 3, 5] and len(seq.own_runs(0, 10)) == 3
    k, v = seq.own_kv()
    assert torch.equal(k, tokens(10)) and torch.equal(v, -tokens(10))
    seq.write(1, tokens(1, 10)[1], tokens(1, 10)[1])  # the 11th token, layer 1 only, not committed
    assert [k.shape[1] for k, _ in seq.layer_kv(1, extra=1)] == [4, 4, 3]
    assert torch.equal(torch.cat([k for k, _ in seq.layer_kv(1, extra=1)], 1), tokens(11)[1])


def test_a_lent_prompt_is_the_same_memory_in_the_tree_and_its_blocks_outlive_the_request():
    pool = BlockPool(2, 1, 3, torch.float32, block_size=4, arena_blocks=8)
    tree = PrefixTree(1 << 20)
    seq = SequenceKV([], 2, 1, 3, torch.float32, capacity=16, pool=pool)
    seq.append(tokens(6), tokens(6))
    assert tree.insert("ctx", list(range(6)), [1] * 6, seq.lend(0, 6)) == 6
    seq.release()
    assert pool.free_blocks == 8 - 2  # the two blocks of the prompt: the tree's now
    m = tree.match("ctx", list(range(6)))
    (chunk,) = m.chunks
    assert chunk.blocks == (0, 1) and torch.equal(chunk.keys, tokens(6))
    other = SequenceKV(m.chunks, 2, 1, 3, torch.float32, capacity=4, pool=pool)
    assert other.table == [2] and other.pieces()[0][0].data_ptr() == pool.arenas[0][0].data_ptr()
    tree.release(m)
    tree.shrink(1 << 20)
    assert pool.free_blocks == 8 - 1  # only the second request's own block is held


def test_a_node_split_inside_a_block_holds_it_from_both_halves():
    pool = BlockPool(2, 1, 3, torch.float32, block_size=4, arena_blocks=8)
    tree = PrefixTree(1 << 20)
    seq = SequenceKV([], 2, 1, 3, torch.float32, capacity=8, pool=pool)
    seq.append(tokens(8), tokens(8))
    tree.insert("ctx", list(range(8)), [1] * 8, seq.lend(0, 8))
    seq.release()
    tree.insert("ctx", [0, 1, 2, 99], [1] * 4, KVChunk(tokens(1, 99), tokens(1, 99)), kv_from=3)  # splits after 3
    assert pool.refs(0) == 2 and pool.refs(1) == 1  # block 0 holds tokens of both halves
    m = tree.match("ctx", list(range(8)))
    assert torch.equal(torch.cat([c.keys for c in m.chunks], 2), tokens(8))
    tree.release(m)
    tree.shrink(1 << 20)
    assert pool.free_blocks == 8


def test_a_garbage_sequence_gives_its_blocks_back():
    pool = BlockPool(2, 1, 3, torch.float32, block_size=4, arena_blocks=8)
    seq = SequenceKV([], 2, 1, 3, torch.float32, capacity=12, pool=pool)
    assert pool.free_blocks == 5
    del seq
    assert pool.free_blocks == 8


def scratch_model(**kw):
    """What :func:`pooled_sequence` reads of a loaded model: its shape, KV dtype, device and scratch pool."""
    from types import SimpleNamespace

    return SimpleNamespace(num_layers=2, config=SimpleNamespace(num_key_value_heads=1), head_dim=3,
                           kv_dtype=torch.float32, device=torch.device("cpu"), scratch_pool=None, **kw)


def test_one_request_sequences_reuse_the_scratch_pool_pages():
    from kvlink_rag.runtime.kv_sequence import pooled_sequence

    lm = scratch_model()
    first = pooled_sequence(lm, 40)
    arena = lm.scratch_pool.arenas[0][0].data_ptr()
    assert len(first.own_runs(0, 40)) == 1
    first.release()
    second = pooled_sequence(lm, 33)  # the next request: the same pool, the same touched pages, one run
    assert lm.scratch_pool.arenas[0][0].data_ptr() == arena and len(second.own_runs(0, 33)) == 1
    third = pooled_sequence(lm, 40)  # while the second lives: a second arena of the same pool
    assert len(third.own_runs(0, 40)) == 1 and third.own_runs(0, 40)[0][0].data_ptr() != arena
    longer = pooled_sequence(lm, 100)  # longer than the arenas: a new pool sized to it
    assert lm.scratch_pool.arena_blocks == 7 and len(longer.own_runs(0, 100)) == 1
    second.append(tokens(33), -tokens(33))
    assert torch.equal(second.own_kv()[0], tokens(33))  # the old pool lives on with its sequences

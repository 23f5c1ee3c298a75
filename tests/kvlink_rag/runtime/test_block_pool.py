"""The KV block pool: consecutive allocation, reference counts, runs, a full pool's reclaimers and error."""

from __future__ import annotations

import pytest
import torch

from kvlink_rag.runtime.block_pool import BlockPool, PoolExhausted


def pool(**kw) -> BlockPool:
    kw.setdefault("block_size", 4)
    kw.setdefault("arena_blocks", 8)
    return BlockPool(2, 1, 3, torch.float32, **kw)


def test_blocks_come_consecutive_and_extend_after_the_last():
    p = pool()
    a = p.allocate(3)
    b = p.allocate(2)
    assert a == [0, 1, 2] and b == [3, 4]
    p.decref(b)
    assert p.allocate(2, after=a[-1]) == [3, 4]  # right after the holder's last block
    assert p.free_blocks == 3 and p.num_blocks == 8


def test_a_block_is_free_only_when_its_last_reference_goes():
    p = pool()
    b = p.allocate(2)
    p.incref(b[:1])
    p.decref(b)
    assert p.refs(b[0]) == 1 and p.refs(b[1]) == 0 and p.free_blocks == 7
    p.decref(b[:1])
    assert p.free_blocks == 8
    with pytest.raises(ValueError, match="already free"):
        p.decref(b[:1])
    with pytest.raises(ValueError, match="is free"):
        p.incref(b[:1])


def test_no_consecutive_room_opens_a_new_arena_until_the_bound_then_scatters():
    p = pool()
    held = p.allocate(8)
    p.decref(held[1::2])  # holes of one block
    assert p.allocate(2) == [8, 9] and p.num_blocks == 16  # unbounded: a new arena, not scattered blocks
    q = pool(max_blocks=8)
    held = q.allocate(8)
    q.decref(held[1::2])
    assert q.allocate(2) == [1, 3]  # bounded: what is free, scattered


def test_spans_merge_consecutive_blocks_and_runs_are_views():
    p = pool()
    blocks = p.allocate(3) + p.allocate(1)  # 0, 1, 2, 3
    assert p.spans(blocks, 2, 9) == [(0, 2, 9)]
    assert p.spans([0, 5, 6], 1, 10) == [(0, 1, 3), (0, 20, 7)]
    k, v = p.runs(blocks, 2, 9)[0]
    k.fill_(1.0)
    assert k.shape == (2, 1, 9, 3) and k.data_ptr() == p.arenas[0][0][:, :, 2].data_ptr()
    assert p.arenas[0][0][:, :, 2:11].eq(1.0).all()


def test_a_full_pool_asks_its_reclaimers_then_refuses_with_the_numbers():
    p = pool(max_blocks=8)
    held = p.allocate(6)
    asked = []

    def reclaim(nbytes: int) -> int:  # a tree with two blocks to give, once
        asked.append(nbytes)
        if len(asked) == 1:
            p.decref(held[:2])
        return nbytes if len(asked) == 1 else 0

    p.add_reclaimer(reclaim)
    assert len(p.allocate(4)) == 4 and asked == [2 * p.block_bytes]
    with pytest.raises(PoolExhausted, match="0 free blocks of 8") as e:
        p.allocate(1)
    assert e.value.needed == 1 and len(asked) == 2


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="block_size"):
        BlockPool(1, 1, 1, torch.float32, block_size=0)
    with pytest.raises(ValueError, match="idle_s -1"):
        BlockPool(1, 1, 1, torch.float32, idle_s=-1)


def test_an_arena_without_a_block_in_use_is_given_back_but_the_first_and_one_spare():
    p = pool(idle_s=0)  # given back at once
    first, second, third = p.allocate(8), p.allocate(3), p.allocate(8)
    assert p.num_blocks == 24 and second == [8, 9, 10] and third == list(range(16, 24))
    spare = p.arenas[1][0].data_ptr()
    p.decref(second)
    assert p.num_blocks == 24 and p.free_blocks == 8  # arena 1 empty: kept as the spare
    p.decref(third)
    assert p.num_blocks == 16 and p.arenas[2] is None  # a second empty arena goes
    p.decref(first)
    assert p.num_blocks == 16 and p.free_blocks == 16  # the first arena stays
    assert p.allocate(9) == list(range(9)) and p.arenas[1][0].data_ptr() == spare  # the spare's pages are reused
    assert len(p.allocate(9)) == 9 and p.num_blocks == 24 and p.arenas[2] is not None  # the given-back slot again


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_empty_arenas_are_kept_for_idle_s_and_their_pages_reused_by_the_next_burst():
    clock = FakeClock()
    p = pool(idle_s=30, clock=clock)
    burst = [p.allocate(8) for _ in range(4)]  # four arenas
    ptrs = [p.arenas[a][0].data_ptr() for a in range(4)]
    for b in burst[1:]:
        p.decref(b)
    clock.now += 29
    assert p.trim() == 0 and p.num_blocks == 32  # empty for 29 s: all kept
    again = [p.allocate(8) for _ in range(3)]  # the next burst lands in the same (touched) arenas
    assert again == [list(range(8, 16)), list(range(16, 24)), list(range(24, 32))]
    assert [p.arenas[a][0].data_ptr() for a in range(4)] == ptrs
    for b in again:
        p.decref(b)
    clock.now += 10
    assert p.trim() == 0  # the clock restarted when they emptied again
    clock.now += 20
    assert p.trim() == 1 + 1 and p.num_blocks == 16  # 30 s: arenas 2 and 3 go, the first and the spare (1) stay
    assert p.arenas[1] is not None and p.arenas[2] is None and p.arenas[3] is None
    p.decref(burst[0])
    clock.now += 60
    assert p.trim() == 0 and p.num_blocks == 16  # the first arena never goes, nor the one spare


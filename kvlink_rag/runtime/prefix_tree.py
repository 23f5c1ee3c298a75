"""A radix tree of prompt items with their KV, shared across requests (SGLang's RadixAttention,
Zheng et al., 2024, arXiv 2312.07104, section 3; reference counts and LRU eviction as there).

Items are hashable prompt units in storage order: a token id (one token), a stored document's cache key
(all its tokens, re-rotated at the offset its path gives it), a slot's link tokens (K tokens). The path
from the root fixes every item's position, so a node's KV (keys after RoPE) is valid for every request
whose prompt starts with that path. Each tree is rooted per *context key* (adapter, link tokens,
encoding): KV computed under another adapter is never matched.

Nodes hold :class:`~kvlink_rag.runtime.ragged.KVChunk` values; matching returns the chunks themselves (a partial
match is a view of a node's leading tokens), so requests share them without copies. Requests never write
into a chunk (copy-on-write: what a request adds is its own until it is inserted). Nodes on a running
request's path are pinned (reference counted); unpinned leaves are evicted least recently used when the
tree exceeds its byte budget.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

from .ragged import KVChunk

Item = Hashable


@dataclass(eq=False)
class Node:
    """A tree node: the edge ``items`` from its parent, their KV, token counts per item.

    Attributes:
        items: the edge label (>= 1 item; the root has none).
        sizes: tokens per item (same length as ``items``).
        kv: keys/values of all the edge's tokens (``sum(sizes)`` tokens), None at the root.
        refs: running requests whose path includes this node (pinned while > 0).
        last_used: logical clock of the last match or insert touching it.
    """

    items: tuple
    sizes: tuple[int, ...]
    kv: KVChunk | None
    parent: Node | None = None
    children: dict = field(default_factory=dict)
    refs: int = 0
    last_used: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(self.sizes)

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes if self.kv is not None else 0


@dataclass
class Match:
    """The result of :meth:`PrefixTree.match`.

    Attributes:
        chunks: shared KV in order (views, not copies).
        items: number of leading items matched.
        tokens: number of leading tokens matched.
        node: the deepest node reached, pinned until :meth:`PrefixTree.release` (its ancestors are safe:
            only leaves are evicted), or None.
    """

    chunks: list[KVChunk]
    items: int
    tokens: int
    node: Node | None


class PrefixTree:
    """Shared prefix KV under a byte budget.

    Args:
        budget_bytes: total KV bytes kept; unpinned least-recently-used leaves are evicted beyond it
            (0 disables sharing: nothing is kept).
    Thread safety: every method takes the tree's lock.
    """

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self.roots: dict[Hashable, Node] = {}
        self.nbytes = 0
        self.evicted_bytes = 0
        self.hit_tokens = 0
        self._clock = itertools.count(1)
        self._lock = threading.RLock()

    def match(self, context: Hashable, items: Sequence[Item]) -> Match:
        """The longest stored prefix of ``items`` under ``context``, pinned (call :meth:`release`)."""
        with self._lock:
            node = self.roots.get(context)
            chunks, nodes, n_items, n_tokens, now = [], [], 0, 0, next(self._clock)
            while node is not None and n_items < len(items):
                child = node.children.get(items[n_items])
                if child is None:
                    break
                j = 0
                while j < len(child.items) and n_items + j < len(items) and child.items[j] == items[n_items + j]:
                    j += 1
                t = sum(child.sizes[:j])
                if j < len(child.items):  # pin only what is used: the rest stays evictable (SGLang splits too)
                    child = self._split(child, j)
                chunks.append(child.kv)
                nodes.append(child)
                n_items, n_tokens = n_items + j, n_tokens + t
                if j < len(child.items):
                    break
                node = child
            for nd in nodes:
                nd.last_used = now
            if nodes:
                nodes[-1].refs += 1
            self.hit_tokens += n_tokens
            return Match(chunks, n_items, n_tokens, nodes[-1] if nodes else None)

    def release(self, match: Match) -> None:
        """Unpin the nodes of ``match`` (once per match)."""
        with self._lock:
            if match.node is not None:
                match.node.refs -= 1
            self._evict()

    def insert(self, context: Hashable, items: Sequence[Item], sizes: Sequence[int], kv: KVChunk,
               kv_from: int = 0) -> int:
        """Store ``items`` (``sizes`` tokens each); the part already stored is skipped.

        Args:
            kv: keys/values ``[layers, kv_heads, tokens, head_dim]`` of ``items[kv_from:]`` (kept by
                reference: views of a request's own buffers, which it decodes on in, are held once).
            kv_from: items before it are expected in the tree already (the request's match).
        Returns:
            new tokens stored (0 when sharing is off, everything was there, or the path before ``kv_from``
            is gone).
        Raises:
            ValueError: ``items`` and ``sizes`` differ in length, or ``kv`` has another token count.
        """
        if len(items) != len(sizes) or kv.num_tokens != sum(sizes[kv_from:]):
            raise ValueError(f"{len(items)} items, {len(sizes)} sizes, {sum(sizes[kv_from:])} tokens from item "
                             f"{kv_from} but KV of {kv.num_tokens}")
        if self.budget_bytes <= 0 or len(items) <= kv_from:
            return 0
        base = sum(sizes[:kv_from])
        with self._lock:
            node = self.roots.setdefault(context, Node((), (), None))
            i, at, now = 0, 0, next(self._clock)
            while i < len(items):
                child = node.children.get(items[i])
                if child is None:
                    if i < kv_from:
                        return 0
                    new = Node(tuple(items[i:]), tuple(sizes[i:]), kv.slice(at - base, kv.num_tokens).retain(), node,
                               last_used=now)
                    node.children[items[i]] = new
                    self.nbytes += new.nbytes
                    self._evict()
                    return new.num_tokens
                j = 0
                while j < len(child.items) and i + j < len(items) and child.items[j] == items[i + j]:
                    j += 1
                if j < len(child.items):
                    child = self._split(child, j)  # the head holds the matched items; go on from there
                child.last_used = now
                i, at, node = i + j, at + sum(sizes[i:i + j]), child
            return 0

    def _split(self, node: Node, j: int) -> Node:
        """Cut ``node``'s edge after ``j`` items: a new parent holds the first ``j`` (views, no copies); a pin
        stays on ``node``, and the head is safe as its parent."""
        t = sum(node.sizes[:j])
        head = Node(node.items[:j], node.sizes[:j], node.kv.slice(0, t).retain(), node.parent, last_used=node.last_used)
        node.parent.children[node.items[0]] = head
        node.items, node.sizes = node.items[j:], node.sizes[j:]
        old, node.kv = node.kv, node.kv.slice(t, t + sum(node.sizes)).retain()
        old.drop()  # its blocks: one reference each from the head and the tail now
        node.parent = head
        head.children[node.items[0]] = node
        return head

    def _leaves(self) -> list[Node]:
        """Unpinned leaves (the only evictable nodes)."""
        return [nd for r in self.roots.values() for nd in _walk(r) if not nd.children and nd.refs <= 0]

    def _evict(self, target: int | None = None) -> None:
        """Drop unpinned least-recently-used leaves until within budget (or ``target`` bytes; parents may
        become leaves); their blocks go back to the pool unless a request still holds them."""
        limit = self.budget_bytes if target is None else target
        while self.nbytes > limit:
            leaves = self._leaves()
            if not leaves:
                return
            victim = min(leaves, key=lambda nd: nd.last_used)
            del victim.parent.children[victim.items[0]]
            victim.kv.drop()
            self.nbytes -= victim.nbytes
            self.evicted_bytes += victim.nbytes

    def shrink(self, nbytes: int) -> int:
        """Evict unpinned LRU leaves worth about ``nbytes`` (the KV pool is full:
        :meth:`~kvlink_rag.runtime.block_pool.BlockPool.add_reclaimer`); returns the bytes dropped."""
        with self._lock:
            before = self.nbytes
            self._evict(max(0, self.nbytes - nbytes))
            return before - self.nbytes

    def stats(self) -> dict:
        """``{nodes, bytes, budget_bytes, evicted_bytes, hit_tokens, pinned_nodes}``."""
        with self._lock:
            nodes = [c for r in self.roots.values() for c in _walk(r)]
            return {"nodes": len(nodes), "bytes": self.nbytes, "budget_bytes": self.budget_bytes,
                    "evicted_bytes": self.evicted_bytes, "hit_tokens": self.hit_tokens,
                    "pinned_nodes": sum(nd.refs > 0 for nd in nodes)}


def _walk(root: Node) -> list[Node]:
    out, stack = [], list(root.children.values())
    while stack:
        nd = stack.pop()
        out.append(nd)
        stack.extend(nd.children.values())
    return out

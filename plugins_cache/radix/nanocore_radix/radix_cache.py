"""``radix``: a block-level radix tree of cached prefixes.

Each node is one cached block; its children are keyed by the child block's full token tuple, so two
siblings that share their first token (or all but their last) are distinct children. Only unreferenced
leaves are evictable, least recently released first; an inner node becomes evictable when its last
child is evicted, so removing a block never orphans a descendant.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from nanocore.interfaces import PrefixCache, check_options
from nanocore.toolkit.prefix_cache import EvictableLRU, PrefixCacheCounters, check_insert, full_blocks, published_prefix


@dataclass(eq=False)
class Node:
    block_id: int
    token_ids: tuple[int, ...]
    parent: Node | None = field(repr=False)
    children: dict[tuple[int, ...], Node] = field(default_factory=dict, repr=False)
    #: Released (reference count 0) and not acquired since.
    released: bool = False
    #: LRU stamp of the last release.
    last_released: int = 0


class RadixPrefixCache(PrefixCache):
    auto_priority = 10  # below hash (20): "auto" picks hash
    conformance_requirements = {"incremental_insert": True, "evicts_least_recently_released": True,
                                "rejects_reused_blocks": True}

    def __init__(self, block_size: int, num_blocks: int, options: dict | None = None):
        super().__init__(block_size, num_blocks, check_options("radix", dict(options or {}), {}))
        self._root = Node(block_id=-1, token_ids=(), parent=None)
        self._by_block: dict[int, Node] = {}
        self._evictable = EvictableLRU()  # released leaves only
        self._counters = PrefixCacheCounters()

    def match(self, token_ids: Sequence[int]) -> list[int]:
        blocks = full_blocks(token_ids, self.block_size)
        hits: list[int] = []
        node = self._root
        for block in blocks:
            node = node.children.get(block)
            if node is None:
                break
            hits.append(node.block_id)
        self._counters.record_match(len(blocks), len(hits))
        return hits

    def insert(self, token_ids: Sequence[int], block_ids: Sequence[int]) -> None:
        check_insert(token_ids, block_ids, self.block_size, self.num_blocks)
        start, node = published_prefix(token_ids, block_ids, self.block_size, self._by_block)
        node = node or self._root
        bs = self.block_size
        for block_id, block in zip(block_ids[start:], full_blocks(token_ids[start * bs:len(block_ids) * bs], bs)):
            child = node.children.get(block)
            if child is None:
                child = self._add_child(node, block_id, block)
            node = child  # a node already published under another block id keeps serving this prefix

    def _add_child(self, parent: Node, block_id: int, block: tuple[int, ...]) -> Node:
        if block_id in self._by_block:
            raise ValueError(
                f"block {block_id} is already cached for other tokens; insert only blocks the BlockManager "
                f"allocated fresh (or evicted) for these tokens"
            )
        child = Node(block_id, block, parent)
        parent.children[block] = child
        self._by_block[block_id] = child
        self._evictable.discard(parent.block_id)  # no longer a leaf
        return child

    def acquire(self, block_id: int) -> None:
        node = self._by_block.get(block_id)
        if node is None:
            raise ValueError(f"acquire({block_id}): the block is not cached; acquire only blocks returned by match")
        node.released = False
        self._evictable.discard(block_id)

    def release(self, block_id: int) -> bool:
        node = self._by_block.get(block_id)
        if node is None:
            return False
        node.released = True
        node.last_released = self._evictable.now()
        if not node.children:
            self._evictable.add(block_id, node.last_released)
        return True

    def evict(self) -> int | None:
        block_id = self._evictable.pop_oldest()
        if block_id is None:
            return None
        node = self._by_block.pop(block_id)
        assert not node.children, "only leaves are evictable"
        parent = node.parent
        del parent.children[node.token_ids]
        if parent.released and not parent.children:  # never the root: it is never released
            self._evictable.add(parent.block_id, parent.last_released)  # keeps its place in the LRU order
        self._counters.evictions += 1
        return block_id

    def stats(self) -> dict[str, float]:
        return self._counters.as_stats(len(self._by_block), len(self._evictable))

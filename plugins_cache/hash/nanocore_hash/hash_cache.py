"""``hash``: a table from chained block hashes to cached blocks.

A block's key is xxhash64 over its parent's key and its own token ids, so one lookup per block walks a
prefix. A hit is verified: the entry's token ids must equal the block's and its parent must be the entry
matched one block earlier (object identity, so a hash collision can never return KV computed for other
tokens). Entries stand for token prefixes: evicting a block empties its entry, which stays in the table
while cached descendants hang from it, so re-publishing that prefix makes them reachable again.
Released blocks are evicted least recently released first.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Sequence

import xxhash

from nanocore.interfaces import PrefixCache, check_options
from nanocore.toolkit.prefix_cache import EvictableLRU, PrefixCacheCounters, check_insert, full_blocks, published_prefix

ROOT_KEY = 0


@dataclass(eq=False)
class Entry:
    """One token prefix. ``block_id`` is None once evicted; the entry lives on while it has children."""

    key: int
    token_ids: tuple[int, ...]
    parent: Entry | None = field(repr=False)
    block_id: int | None = None
    num_children: int = 0


def chained_block_hash(parent_key: int, token_ids: tuple[int, ...]) -> int:
    """xxhash64 of the parent's key followed by the block's token ids (uint64, native byte order)."""
    return xxhash.xxh64_intdigest(array("Q", (parent_key, *token_ids)).tobytes())


class HashPrefixCache(PrefixCache):
    auto_priority = 20  # above radix (10) and the builtin "none" (0): "auto" picks hash
    # the suite makes every key collide through block_hash and checks the rest of what these promise
    conformance_requirements = {"block_hash": "block_hash", "incremental_insert": True,
                                "evicts_least_recently_released": True, "rejects_reused_blocks": True}

    def __init__(self, block_size: int, num_blocks: int, options: dict | None = None):
        super().__init__(block_size, num_blocks, check_options("hash", dict(options or {}), {}))
        # key -> entries with that key; more than one only after a hash collision
        self._table: dict[int, list[Entry]] = {}
        self._by_block: dict[int, Entry] = {}
        self._evictable = EvictableLRU()
        self._counters = PrefixCacheCounters()

    block_hash = staticmethod(chained_block_hash)

    def _find(self, key: int, token_ids: tuple[int, ...], parent: Entry | None) -> Entry | None:
        for entry in self._table.get(key, ()):
            if entry.parent is parent and entry.token_ids == token_ids:
                return entry
        return None

    def match(self, token_ids: Sequence[int]) -> list[int]:
        blocks = full_blocks(token_ids, self.block_size)
        hits: list[int] = []
        parent: Entry | None = None
        for block in blocks:
            entry = self._find(self.block_hash(parent.key if parent else ROOT_KEY, block), block, parent)
            if entry is None or entry.block_id is None:
                break
            hits.append(entry.block_id)
            parent = entry
        self._counters.record_match(len(blocks), len(hits))
        return hits

    def insert(self, token_ids: Sequence[int], block_ids: Sequence[int]) -> None:
        check_insert(token_ids, block_ids, self.block_size, self.num_blocks)
        start, parent = published_prefix(token_ids, block_ids, self.block_size, self._by_block)
        bs = self.block_size
        for block_id, block in zip(block_ids[start:], full_blocks(token_ids[start * bs:len(block_ids) * bs], bs)):
            key = self.block_hash(parent.key if parent else ROOT_KEY, block)
            entry = self._find(key, block, parent) or self._add_entry(key, block, parent)
            if entry.block_id is None:
                self._publish(entry, block_id)
            parent = entry  # an entry published under another block id keeps serving this prefix

    def _add_entry(self, key: int, block: tuple[int, ...], parent: Entry | None) -> Entry:
        entry = Entry(key, block, parent)
        self._table.setdefault(key, []).append(entry)
        if parent is not None:
            parent.num_children += 1
        return entry

    def _publish(self, entry: Entry, block_id: int) -> None:
        if block_id in self._by_block:
            self._prune(entry)
            raise ValueError(
                f"block {block_id} is already cached for other tokens; insert only blocks the BlockManager "
                f"allocated fresh (or evicted) for these tokens"
            )
        entry.block_id = block_id
        self._by_block[block_id] = entry

    def _prune(self, entry: Entry | None) -> None:
        """Drop entries that hold no block and have no children, walking up the chain."""
        while entry is not None and entry.block_id is None and not entry.num_children:
            bucket = self._table[entry.key]
            bucket.remove(entry)
            if not bucket:
                del self._table[entry.key]
            if entry.parent is not None:
                entry.parent.num_children -= 1
            entry = entry.parent

    def acquire(self, block_id: int) -> None:
        if block_id not in self._by_block:
            raise ValueError(f"acquire({block_id}): the block is not cached; acquire only blocks returned by match")
        self._evictable.discard(block_id)

    def release(self, block_id: int) -> bool:
        if block_id not in self._by_block:
            return False
        self._evictable.add(block_id)
        return True

    def evict(self) -> int | None:
        block_id = self._evictable.pop_oldest()
        if block_id is None:
            return None
        entry = self._by_block.pop(block_id)
        entry.block_id = None
        self._prune(entry)
        self._counters.evictions += 1
        return block_id

    def stats(self) -> dict[str, float]:
        return self._counters.as_stats(len(self._by_block), len(self._evictable))

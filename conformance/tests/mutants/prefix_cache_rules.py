"""Prefix caches wrong only against the rules a cache declares or the cases random runs rarely reach: it keeps what
it is given, a block after a miss never matches, an acquired block outlives its children, ``stats()`` counts what
happened, an emptied cache holds nothing more, hits compare tokens when keys collide, insert reads only what it
adds. Each is one of the correct caches of ``prefix_cache.py`` (or a plugin's) with one thing changed."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from nanocore_conformance import PrefixCacheConformance, bind_all
from nanocore.toolkit.prefix_cache import full_blocks
from nanocore_hash import HashPrefixCache
from nanocore_radix import RadixPrefixCache

# the correct caches live beside this file (mutant modules are loaded by path, not as a package)
_spec = importlib.util.spec_from_file_location("nanocore_mutants_prefix_cache_base",
                                               Path(__file__).with_name("prefix_cache.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
KeyedPrefixCache, ToyRadixCache = _base.KeyedPrefixCache, _base.ToyRadixCache


class PublishesOnlyTheFirstChunk(KeyedPrefixCache):
    """insert() returns as soon as its first block is already cached, so a prefill's later chunks are never
    published (release() says False for them and match() never returns them)."""

    def insert(self, token_ids, block_ids):
        if block_ids and self.keys(token_ids, 1)[0] in self.block_of:
            return
        super().insert(token_ids, block_ids)


class SkipsMissingBlocks(KeyedPrefixCache):
    """Keys a block by its parent's block id and its tokens; match() skips a block it does not find and goes on
    under the last parent found, so a later block equal to a cached child of that parent is returned."""

    def keys(self, token_ids, num_blocks):
        raise NotImplementedError("keys depend on the blocks found")

    def match(self, token_ids):
        hits, parent = [], None
        for i in range(len(token_ids) // self.block_size):
            block = self.block_of.get((parent, tuple(token_ids[i * self.block_size:(i + 1) * self.block_size])))
            if block is not None:
                hits.append(block)
                parent = block
        return hits

    def insert(self, token_ids, block_ids):
        parent = None
        for i, block in enumerate(block_ids):
            key = (parent, tuple(token_ids[i * self.block_size:(i + 1) * self.block_size]))
            if key not in self.block_of and block not in self.key_of:
                self.block_of[key], self.key_of[block] = block, key
            parent = self.block_of[key]


class AcquireProtectsLeavesOnly(ToyRadixCache):
    """acquire() leaves an inner block in the evictable list (it has children, so it cannot be evicted anyway);
    once its last child is evicted it is evicted while a sequence still uses it."""

    def acquire(self, block_id):
        if not self.node_of[block_id]["children"]:
            super().acquire(block_id)


class CountsEvictCalls(KeyedPrefixCache):
    """stats() counts evict() calls as evictions, also those that returned None."""

    def __init__(self, block_size, num_blocks, options=None):
        super().__init__(block_size, num_blocks, options)
        self.evict_calls = 0

    def evict(self):
        self.evict_calls += 1
        return super().evict()

    def stats(self):
        return {"evictions": self.evict_calls, "cached_blocks": len(self.key_of)}


class KeepsEmptiedEntries(KeyedPrefixCache):
    """evict() empties the block's table entry instead of deleting it: the table grows with every prefix ever cached."""

    def match(self, token_ids):
        blocks = []
        for key in self.keys(token_ids, len(token_ids) // self.block_size):
            if self.block_of.get(key) is None:
                break
            blocks.append(self.block_of[key])
        return blocks

    def insert(self, token_ids, block_ids):
        for key, block in zip(self.keys(token_ids, len(block_ids)), block_ids):
            if self.block_of.get(key) is None and block not in self.key_of:
                self.block_of[key], self.key_of[block] = block, key

    def evict(self):
        if not self.lru:
            return None
        block, _ = self.lru.popitem(last=False)
        self.block_of[self.key_of.pop(block)] = None
        return block


class ComparesParentsOnly(HashPrefixCache):
    """Declares its key function, but a hit compares only the parent entry, not the block's tokens: it trusts a
    64-bit key to tell the children of one parent apart."""

    def _find(self, key, token_ids, parent):
        return next((entry for entry in self._table.get(key, ()) if entry.parent is parent), None)


class RewalksThePrefix(RadixPrefixCache):
    """Declares incremental_insert, but insert() walks the whole prefix from the root on every call: a decode that
    publishes one block re-reads every token of the sequence."""

    def insert(self, token_ids, block_ids):
        node = self._root
        for block_id, block in zip(block_ids, full_blocks(token_ids, self.block_size, len(block_ids))):
            node = node.children.get(block) or self._add_child(node, block_id, block)


class EvictsNewestFirst(KeyedPrefixCache):
    """Declares evicts_least_recently_released, but evict() pops the most recently released block (a stack)."""

    conformance_requirements = {"evicts_least_recently_released": True}

    def evict(self):
        if not self.lru:
            return None
        block, _ = self.lru.popitem(last=True)
        del self.block_of[self.key_of.pop(block)]
        return block


class TrustsCachedBlockIds(HashPrefixCache):
    """Declares rejects_reused_blocks, but insert() resumes after any cached block id of the sequence without
    comparing its tokens: a block cached for other tokens is taken as this prefix's, silently."""

    def insert(self, token_ids, block_ids):
        cached = [i for i, block in enumerate(block_ids) if block in self._by_block]
        start = cached[-1] + 1 if cached else 0
        parent = self._by_block[block_ids[start - 1]] if start else None
        for block_id, block in zip(block_ids[start:], full_blocks(token_ids[start * self.block_size:],
                                                                  self.block_size, len(block_ids) - start)):
            key = self.block_hash(parent.key if parent else 0, block)
            entry = self._find(key, block, parent) or self._add_entry(key, block, parent)
            if entry.block_id is None:
                self._publish(entry, block_id)
            parent = entry


MUTANTS = [PublishesOnlyTheFirstChunk, SkipsMissingBlocks, AcquireProtectsLeavesOnly, CountsEvictCalls,
           KeepsEmptiedEntries, ComparesParentsOnly, RewalksThePrefix,
           EvictsNewestFirst, TrustsCachedBlockIds]
bind_all(globals(), PrefixCacheConformance, MUTANTS)

"""Prefix caches the suite must accept (CORRECT) and reject (MUTANTS).

Two small correct caches written from the interface as a third party would: ``KeyedPrefixCache`` (a table
from a chained block key to a block, LRU of released blocks) and ``ToyRadixCache`` (a tree of blocks that
evicts released leaves). Each mutant changes one thing of one of them.
"""
from __future__ import annotations

from collections import OrderedDict

from nanocore.interfaces import PrefixCache
from nanocore_conformance import PrefixCacheConformance, bind_all
from nanocore_hash import HashPrefixCache
from nanocore_radix import RadixPrefixCache


class KeyedPrefixCache(PrefixCache):
    """Block key = (parent's key, the block's tokens): exact, compared structurally (a dict reference cache)."""

    def __init__(self, block_size, num_blocks, options=None):
        super().__init__(block_size, num_blocks, options)
        self.block_of, self.key_of, self.lru = {}, {}, OrderedDict()

    def block_key(self, parent_key, block_tokens):
        return parent_key, block_tokens

    def keys(self, token_ids, num_blocks):
        keys, parent = [], None
        for i in range(num_blocks):
            parent = self.block_key(parent, tuple(token_ids[i * self.block_size:(i + 1) * self.block_size]))
            keys.append(parent)
        return keys

    def match(self, token_ids):
        blocks = []
        for key in self.keys(token_ids, len(token_ids) // self.block_size):
            if key not in self.block_of:
                break
            blocks.append(self.block_of[key])
        return blocks

    def insert(self, token_ids, block_ids):
        for key, block in zip(self.keys(token_ids, len(block_ids)), block_ids):
            if key not in self.block_of and block not in self.key_of:
                self.block_of[key], self.key_of[block] = block, key

    def acquire(self, block_id):
        self.lru.pop(block_id, None)

    def release(self, block_id):
        if block_id in self.key_of:
            self.lru[block_id] = None
            return True
        return False

    def evict(self):
        if not self.lru:
            return None
        block, _ = self.lru.popitem(last=False)
        del self.block_of[self.key_of.pop(block)]
        return block


class ChainHashCache(KeyedPrefixCache):
    """Trusts a 64-bit-ish hash of (parent hash, tokens) as the key, as most hash caches do."""

    def block_key(self, parent_key, block_tokens):
        return hash((parent_key, block_tokens))


class ToyRadixCache(PrefixCache):
    """Children keyed by their block's tokens; only released leaves are evicted, oldest release first."""

    def __init__(self, block_size, num_blocks, options=None):
        super().__init__(block_size, num_blocks, options)
        self.root = {"children": {}, "block": None, "parent": None}
        self.node_of, self.released = {}, OrderedDict()

    def child_key(self, block_tokens):
        return block_tokens

    def walk(self, token_ids, num_blocks):
        node, path = self.root, []
        for i in range(num_blocks):
            node = node["children"].get(self.child_key(tuple(token_ids[i * self.block_size:(i + 1) * self.block_size])))
            if node is None:
                break
            path.append(node)
        return path

    def match(self, token_ids):
        return [node["block"] for node in self.walk(token_ids, len(token_ids) // self.block_size)]

    def insert(self, token_ids, block_ids):
        node = self.root
        for i, block in enumerate(block_ids):
            key = self.child_key(tuple(token_ids[i * self.block_size:(i + 1) * self.block_size]))
            child = node["children"].get(key)
            if child is None:
                if block in self.node_of:
                    return
                child = node["children"][key] = {"children": {}, "block": block, "parent": node, "key": key}
                self.node_of[block] = child
            node = child

    def acquire(self, block_id):
        self.released.pop(block_id, None)

    def release(self, block_id):
        if block_id in self.node_of:
            self.released[block_id] = None
            return True
        return False

    def evict(self):
        for block in self.released:
            node = self.node_of[block]
            if not node["children"]:
                del self.released[block], self.node_of[block], node["parent"]["children"][node["key"]]
                return block
        return None


class HashesHalfBlock(ChainHashCache):
    """The key covers only the first 8 tokens of a block (a hash written for 8-token blocks)."""

    def block_key(self, parent_key, block_tokens):
        return hash((parent_key, block_tokens[:8]))


class HashesParentOnly(ChainHashCache):
    """The key covers only the parent link, not the block's own tokens."""

    def block_key(self, parent_key, block_tokens):
        return hash((parent_key, len(block_tokens)))


class HashesTokensOnly(ChainHashCache):
    """The key covers only the block's own tokens, not the chain: equal blocks after other prefixes collide."""

    def block_key(self, parent_key, block_tokens):
        return hash(block_tokens)


class EvictsReferencedBlocks(KeyedPrefixCache):
    """acquire() does nothing: a block matched again stays evictable while a sequence uses it."""

    def acquire(self, block_id):
        pass


class ForgetsNothing(KeyedPrefixCache):
    """evict() returns a block but keeps matching it while the BlockManager overwrites its KV."""

    def evict(self):
        return self.lru.popitem(last=False)[0] if self.lru else None


class KeepsEverything(KeyedPrefixCache):
    """release() claims to keep blocks it never cached, so the BlockManager never frees them."""

    def release(self, block_id):
        super().release(block_id)
        return True


class EvictsBlocksInUse(KeyedPrefixCache):
    """evict() takes the oldest cached block, released or not (FIFO over everything cached)."""

    def evict(self):
        if not self.key_of:
            return None
        block = next(iter(self.key_of))
        self.lru.pop(block, None)
        del self.block_of[self.key_of.pop(block)]
        return block


class SiblingsByFirstToken(ToyRadixCache):
    """Children keyed by their first token only: siblings that share it are confused."""

    def child_key(self, block_tokens):
        return block_tokens[0]


class MatchesPartialLastBlock(ToyRadixCache):
    """match() also walks the trailing partial block, into a child whose tokens start with it."""

    def match(self, token_ids):
        hits = [node["block"] for node in self.walk(token_ids, len(token_ids) // self.block_size)]
        tail = tuple(token_ids[len(hits) * self.block_size:])
        if hits and 0 < len(tail) < self.block_size:
            for key, child in self.node_of[hits[-1]]["children"].items():
                if key[:len(tail)] == tail:
                    hits.append(child["block"])
                    break
        return hits


class TableSlotKeys(KeyedPrefixCache):
    """Keys blocks by their chained hash's slot in a 4096-entry table and trusts the slot: no token compare on a hit,
    so two children of one parent that land in one slot are confused."""

    def block_key(self, parent_key, block_tokens):
        return hash((parent_key, block_tokens)) % 4096


class EvictsInnerBlocksInPlace(ToyRadixCache):
    """Evicts the earliest-inserted released block, inner or not; an evicted inner block stays in the tree as a
    pass-through (pruned with its last child), so match() walks through it and returns its id after evicting it."""

    def evict(self):
        block = next((b for b in self.node_of if b in self.released), None)
        if block is None:
            return None
        del self.released[block]
        node = self.node_of.pop(block)
        node["evicted"] = True
        while node.get("evicted") and not node["children"] and node["parent"] is not None:
            del node["parent"]["children"][node["key"]]
            node = node["parent"]
        return block


CORRECT = [KeyedPrefixCache, ChainHashCache, ToyRadixCache, HashPrefixCache, RadixPrefixCache]
MUTANTS = [HashesHalfBlock, HashesParentOnly, HashesTokensOnly, EvictsReferencedBlocks, ForgetsNothing,
           KeepsEverything, EvictsBlocksInUse, SiblingsByFirstToken, MatchesPartialLastBlock, TableSlotKeys,
           EvictsInnerBlocksInPlace]
bind_all(globals(), PrefixCacheConformance, CORRECT + MUTANTS)

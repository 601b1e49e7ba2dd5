"""The BlockManager's side of the explicit prefix-cache cases: reference counts, the KV each block really holds,
which blocks the cache keeps, and what the cache must therefore return and report.

A block ``insert`` publishes for a prefix that no live block serves becomes that prefix's server; with
``keeps_inserted_blocks`` the cache must keep every server (``release`` True) and ``match`` must return the servers
of a query's leading prefixes. A block computed for a prefix already served (two sequences computed it at once) may
be cached or not.
"""
from __future__ import annotations

import gc
import itertools
import math
import types

#: Objects the reachable-state count never walks into: shared by every instance, so they never grow with use.
SHARED_TYPES = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                types.CodeType, types.FrameType)


def reachable_objects(root: object, limit: int = 200_000) -> int:
    """How many distinct objects ``root`` reaches (its state), classes, modules and functions excluded."""
    seen, stack = {id(root)}, [root]
    while stack and len(seen) < limit:
        for ref in gc.get_referents(stack.pop()):
            if id(ref) not in seen and not isinstance(ref, SHARED_TYPES):
                seen.add(id(ref))
                stack.append(ref)
    return len(seen)


class GroundTruth:
    """Drives one cache as the BlockManager does and checks every answer against the blocks' real content."""

    def __init__(self, cache, num_blocks: int, keeps: bool, lru: bool = False, counts_stats: bool = True):
        self.cache, self.bs, self.keeps, self.lru = cache, cache.block_size, keeps, lru
        self.counts_stats = counts_stats  # stats() counters are checked (a rule of plugin API 1.6)
        self.released_at: dict[int, int] = {}  # kept block -> when release() last returned True for it
        self.clock = itertools.count()
        self.ref = {b: 0 for b in range(num_blocks)}
        self.content: dict[int, tuple | None] = {b: None for b in range(num_blocks)}
        self.kept: set[int] = set()
        self.evicted: set[int] = set()  # evicted and not written since
        self.server: dict[tuple, int] = {}  # prefix -> the block first published for it
        self.free = list(range(num_blocks))
        self.counts = {"queries": 0, "query_blocks": 0, "hit_blocks": 0, "evictions": 0}

    def prefix(self, tokens, i) -> tuple:
        return tuple(tokens[:(i + 1) * self.bs])

    def serves(self, prefix: tuple) -> bool:
        block = self.server.get(prefix)
        return block is not None and self.content[block] == prefix and (self.ref[block] > 0 or block in self.kept)

    def required(self, tokens) -> int:
        """Leading blocks of ``tokens`` that ``match`` must return: each one's prefix has a live server."""
        count = 0
        while self.keeps and (count + 1) * self.bs <= len(tokens) and self.serves(self.prefix(tokens, count)):
            count += 1
        return count

    def check(self, tokens, why: str) -> list[int]:
        hits = list(self.cache.match(tokens))
        self.counts["queries"] += 1
        self.counts["query_blocks"] += len(tokens) // self.bs
        self.counts["hit_blocks"] += len(hits)
        assert len(hits) * self.bs <= len(tokens) and len(set(hits)) == len(hits), (
            f"match() of {len(tokens)} tokens returned {hits}: full blocks only, each once ({why})")
        for i, block in enumerate(hits):
            if block in self.evicted:
                raise AssertionError(f"match returned block {block} (block {i} of the query) after it was evicted "
                                     f"({why}); evict must forget the block, also an inner one whose children stay")
            held = self.content.get(block)
            assert held == self.prefix(tokens, i) and (self.ref[block] or block in self.kept), (
                f"match returned block {block} for tokens [{i * self.bs}, {(i + 1) * self.bs}) but it holds KV of "
                f"{'nothing' if held is None else 'other tokens'} ({why}); a hit must compare the block's tokens and "
                f"its whole prefix, whatever its key")
        required = self.required(tokens)
        assert len(hits) >= required, (
            f"match returned {len(hits)} blocks {hits}, but the first {required} blocks of these tokens were inserted "
            f"as {[self.server[self.prefix(tokens, i)] for i in range(required)]} and not evicted ({why}); a cache "
            f"keeps what it is given (declare conformance_requirements = {{'keeps_inserted_blocks': False}} if it "
            f"caches only some blocks by design)")
        return hits

    def allocate(self) -> int | None:
        """A free block, else one the cache evicts (None when neither)."""
        if not self.free and self.evict() is None:
            return None
        return self.free.pop(0)

    def compute(self, tokens, blocks: list[int], num_blocks: int) -> None:
        """The first ``num_blocks`` of a sequence's ``blocks`` hold their tokens' KV; publish them."""
        for i, block in enumerate(blocks[:num_blocks]):
            if self.content[block] is None:
                self.content[block] = self.prefix(tokens, i)
                self.evicted.discard(block)
        self.cache.insert(tokens[:num_blocks * self.bs], blocks[:num_blocks])
        for i, block in enumerate(blocks[:num_blocks]):
            if not self.serves(self.prefix(tokens, i)):
                self.server[self.prefix(tokens, i)] = block

    def admit(self, tokens, why: str, match: bool = True) -> list[int]:
        """A new sequence of ``tokens`` (whole blocks): matched blocks acquired (none with ``match=False``, as for a
        sequence admitted before another published the same prefix), the rest allocated. Nothing is computed."""
        hits = self.check(tokens, why) if match else []
        self.acquire(hits)
        blocks = list(hits)
        while len(blocks) < len(tokens) // self.bs and (block := self.allocate()) is not None:
            self.ref[block] += 1
            blocks.append(block)
        return blocks

    def start(self, tokens, why: str) -> list[int]:
        """``admit``, then compute and insert every block. Returns its blocks (fewer when KV runs out)."""
        blocks = self.admit(tokens, why)
        self.compute(tokens, blocks, len(blocks))
        return blocks

    def acquire(self, blocks) -> None:
        for block in blocks:
            if self.ref[block] == 0:
                self.cache.acquire(block)
            self.ref[block] += 1

    def release(self, blocks) -> None:
        for block in reversed(blocks):  # tail first, as the BlockManager frees
            self.ref[block] -= 1
            if self.ref[block]:
                continue
            content = self.content[block]
            if self.cache.release(block):
                self.kept.add(block)
                self.released_at[block] = next(self.clock)
                continue
            assert not (self.keeps and content is not None and self.server.get(content) == block), (
                f"release({block}) returned False, but block {block} was inserted for a prefix no other block held "
                f"and was not evicted; keep it (or declare conformance_requirements = "
                f"{{'keeps_inserted_blocks': False}} if the cache keeps only some blocks by design)")
            self.kept.discard(block)
            self.content[block] = None
            self.free.append(block)

    def evict(self) -> int | None:
        block = self.cache.evict()
        if block is not None:
            assert self.ref.get(block, 0) == 0, (
                f"evict() returned block {block}, which a sequence still uses (acquired when match returned it); an "
                f"acquired block is never evicted before its next release, also once its children are evicted")
            assert block in self.kept, (
                f"evict() returned block {block}, which the cache does not keep (release never returned True for it, "
                f"or it was evicted already)")
            self.counts["evictions"] += 1
            self._check_lru(block)
            self.kept.discard(block)
            self.content[block] = None
            self.evicted.add(block)
            self.free.append(block)
        return block

    def _check_lru(self, block: int) -> None:
        """With ``lru``: no idle kept block released before ``block`` is a leaf (a prefix no live block extends)."""
        if not self.lru:
            return
        live = [c for b, c in self.content.items() if c is not None and (self.ref[b] or b in self.kept)]
        for other in self.kept - {block}:
            prefix = self.content[other]
            older = self.released_at.get(other, 0) < self.released_at.get(block, 0)
            if older and not self.ref[other] and not any(len(c) > len(prefix) and c[:len(prefix)] == prefix
                                                         for c in live):
                raise AssertionError(
                    f"evict() returned block {block} while block {other}, released earlier and holding no prefix of "
                    f"another cached block, stays kept; the cache declares evicts_least_recently_released")

    def evict_all(self) -> list[int]:
        evicted = []
        while (block := self.evict()) is not None:
            evicted.append(block)
        return evicted

    def check_stats(self, why: str) -> None:
        """The counters of ``stats()`` that the toolkit names, each checked when the cache reports it."""
        if not self.counts_stats:
            return
        stats = self.cache.stats()
        assert isinstance(stats, dict) and all(isinstance(v, (int, float)) for v in stats.values()), (
            f"stats() must return a dict of numbers, got {stats!r}")
        expected = dict(self.counts)
        expected["block_hit_rate"] = self.counts["hit_blocks"] / max(self.counts["query_blocks"], 1)
        if not any(self.ref.values()):  # every cached block is idle: the cache holds exactly the kept ones
            expected["cached_blocks"] = len(self.kept)
        for key, value in expected.items():
            assert key not in stats or math.isclose(stats[key], value, abs_tol=1e-9), (
                f"stats()[{key!r}] is {stats[key]}, but {value} happened ({why}): the toolkit's counters mean "
                f"match() calls (queries), their full blocks (query_blocks), blocks returned (hit_blocks), blocks "
                f"evict() returned (evictions), blocks held (cached_blocks)")
        evictable = stats.get("evictable_blocks")
        assert evictable is None or 0 <= evictable <= len(self.kept), (
            f"stats()['evictable_blocks'] is {evictable}, but only {len(self.kept)} blocks are released and kept "
            f"({why})")

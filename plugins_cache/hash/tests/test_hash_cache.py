"""Unit and stateful tests of the ``hash`` prefix cache."""
import pytest
from hypothesis import given, settings

from nanocore.plugins import get_registry
from nanocore_conformance.prefix_cache_reference import OPS, prefix_cache_machine, replay
from nanocore_hash import HashPrefixCache


def test_match_returns_computed_full_blocks_only():
    cache = HashPrefixCache(block_size=4, num_blocks=8)
    tokens = list(range(10))
    cache.insert(tokens, [5, 6])
    assert cache.match(tokens) == [5, 6]
    assert cache.match(tokens[:7]) == [5]  # the partial second block never matches
    assert cache.match([0, 1, 2, 9, 4, 5, 6, 7]) == []


def test_chain_depends_on_whole_prefix():
    cache = HashPrefixCache(block_size=2, num_blocks=8)
    cache.insert([1, 2, 3, 4], [0, 1])
    assert cache.match([9, 9, 3, 4]) == []  # same second block, different first block


def test_collision_never_returns_wrong_kv():
    class Colliding(HashPrefixCache):
        block_hash = staticmethod(lambda parent, tokens: 7)  # every block collides
    cache = Colliding(block_size=2, num_blocks=8)
    cache.insert([1, 2, 3, 4], [0, 1])
    cache.insert([5, 6, 3, 4], [2, 3])
    assert cache.match([1, 2, 3, 4]) == [0, 1]
    assert cache.match([5, 6, 3, 4]) == [2, 3]
    assert cache.match([1, 2, 5, 6]) == [0]


def test_children_of_an_evicted_block_return_once_its_prefix_is_published_again():
    class Colliding(HashPrefixCache):
        block_hash = staticmethod(lambda parent, tokens: 7)
    cache = Colliding(block_size=2, num_blocks=8)
    cache.insert([1, 2, 3, 4], [0, 1])
    cache.release(0)
    assert cache.evict() == 0
    assert cache.match([1, 2, 3, 4]) == []
    cache.insert([8, 8], [0])  # block 0 reused for other tokens: block 1 must not hang from it
    assert cache.match([8, 8, 3, 4]) == [0]
    cache.insert([1, 2], [2])
    assert cache.match([1, 2, 3, 4]) == [2, 1]
    cache.release(1)
    cache.release(2)
    assert [cache.evict(), cache.evict(), cache.evict()] == [1, 2, None]
    assert cache._table.keys() == {7} and len(cache._table[7]) == 1  # emptied entries are dropped


def test_lru_evicts_least_recently_released_and_acquire_protects():
    cache = HashPrefixCache(block_size=1, num_blocks=8)
    cache.insert([1, 2, 3], [0, 1, 2])
    for block in (2, 0, 1):
        assert cache.release(block) is True
    cache.acquire(0)
    assert cache.evict() == 2
    assert cache.evict() == 1
    assert cache.evict() is None
    assert cache.release(5) is False  # never cached: straight to the free list
    stats = cache.stats()
    assert stats["cached_blocks"] == 1 and stats["evictions"] == 2 and stats["evictable_blocks"] == 0


def test_duplicate_publish_keeps_first_block():
    cache = HashPrefixCache(block_size=2, num_blocks=8)
    cache.insert([1, 2, 3, 4], [0, 1])
    cache.insert([1, 2, 3, 4], [2, 3])
    assert cache.match([1, 2, 3, 4]) == [0, 1]
    assert cache.release(2) is False


def test_match_is_pure_and_counted():
    cache = HashPrefixCache(block_size=2, num_blocks=8)
    cache.insert([1, 2, 3, 4], [0, 1])
    cache.release(1)
    before = {k: v for k, v in cache.stats().items() if k not in ("queries", "query_blocks", "hit_blocks", "block_hit_rate")}
    assert cache.match([1, 2, 3, 4, 5, 6]) == [0, 1]
    after = cache.stats()
    assert {k: after[k] for k in before} == before
    assert after["queries"] == 1 and after["query_blocks"] == 3 and after["hit_blocks"] == 2


def test_user_errors_say_what_to_do():
    with pytest.raises(ValueError, match="unknown option"):
        HashPrefixCache(2, 8, {"bogus": 1})
    cache = HashPrefixCache(block_size=2, num_blocks=8)
    with pytest.raises(ValueError, match="computed tokens"):
        cache.insert([1, 2, 3], [0, 1])
    with pytest.raises(ValueError, match="outside"):
        cache.insert([1, 2], [99])
    with pytest.raises(ValueError, match="not cached"):
        cache.acquire(3)


def test_auto_picks_hash():
    assert get_registry().resolve("prefix_cache", "auto", "cpu").name == "hash"


TestHashAgainstReference = prefix_cache_machine(HashPrefixCache, leaves_only=False).TestCase
TestHashAgainstReference.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_hash_and_radix_return_the_same_hits(ops):
    radix = pytest.importorskip("nanocore_radix", reason="install plugins_cache/radix for the cross-check")
    assert replay(HashPrefixCache, ops, leaves_only=False) == replay(radix.RadixPrefixCache, ops, leaves_only=True)

"""Unit and stateful tests of the ``radix`` prefix cache."""
import pytest
from hypothesis import settings

from nanocore.plugins import get_registry
from nanocore_conformance.prefix_cache_reference import prefix_cache_machine
from nanocore_radix import RadixPrefixCache


def test_siblings_sharing_first_token_are_distinct():
    cache = RadixPrefixCache(block_size=3, num_blocks=8)
    cache.insert([1, 2, 3, 4, 5, 6], [0, 1])
    cache.insert([1, 2, 3, 4, 5, 7], [0, 2])
    cache.insert([1, 2, 9], [3])
    assert cache.match([1, 2, 3, 4, 5, 6]) == [0, 1]
    assert cache.match([1, 2, 3, 4, 5, 7, 8]) == [0, 2]
    assert cache.match([1, 2, 9, 4, 5, 6]) == [3]
    assert cache.match([1, 2, 4]) == []


def test_evicts_leaves_in_lru_order_and_never_orphans():
    cache = RadixPrefixCache(block_size=1, num_blocks=8)
    cache.insert([1, 2, 3], [0, 1, 2])
    cache.insert([1, 5], [0, 3])
    for block in (0, 3, 1, 2):  # the root block is released first, but it has children
        assert cache.release(block) is True
    assert cache.stats()["evictable_blocks"] == 2  # leaves 3 and 2
    assert cache.evict() == 3
    assert cache.evict() == 2
    assert cache.evict() == 1  # became a leaf once block 2 went
    assert cache.evict() == 0
    assert cache.evict() is None


def test_inner_node_keeps_lru_position_when_it_becomes_a_leaf():
    cache = RadixPrefixCache(block_size=1, num_blocks=8)
    cache.insert([1, 2], [0, 1])
    cache.insert([7], [2])
    cache.release(0)
    cache.release(2)
    cache.release(1)
    assert cache.evict() == 2  # the only leaf released before 1
    assert cache.evict() == 1
    assert cache.evict() == 0


def test_acquired_block_is_not_evicted_and_protects_its_parent():
    cache = RadixPrefixCache(block_size=1, num_blocks=8)
    cache.insert([1, 2], [0, 1])
    cache.release(1)
    cache.release(0)
    cache.acquire(1)
    assert cache.evict() is None
    cache.release(1)
    assert [cache.evict(), cache.evict()] == [1, 0]


def test_user_errors_say_what_to_do():
    with pytest.raises(ValueError, match="unknown option"):
        RadixPrefixCache(2, 8, {"bogus": 1})
    cache = RadixPrefixCache(block_size=2, num_blocks=8)
    with pytest.raises(ValueError, match="computed tokens"):
        cache.insert([1], [0])
    with pytest.raises(ValueError, match="not cached"):
        cache.acquire(3)
    cache.insert([1, 2], [0])
    with pytest.raises(ValueError, match="already cached"):
        cache.insert([3, 4], [0])


def test_auto_prefers_hash_over_radix():
    pytest.importorskip("nanocore_hash", reason="install plugins_cache/hash to compare priorities")
    registry = get_registry()
    assert registry.get("prefix_cache", "radix").cls.auto_priority < registry.get("prefix_cache", "hash").cls.auto_priority


TestRadixAgainstReference = prefix_cache_machine(RadixPrefixCache, leaves_only=True).TestCase
TestRadixAgainstReference.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)

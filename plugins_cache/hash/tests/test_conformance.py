"""The shared conformance suite for the ``hash`` prefix cache."""
from nanocore_conformance import PrefixCacheConformance


class TestHash(PrefixCacheConformance):
    backend = "hash"

"""The shared conformance suite for the ``radix`` prefix cache."""
from nanocore_conformance import PrefixCacheConformance


class TestRadix(PrefixCacheConformance):
    backend = "radix"

"""The shared conformance suite for the ``xgrammar`` structured output backend."""
from nanocore_conformance import StructuredOutputConformance


class TestXGrammar(StructuredOutputConformance):
    backend = "xgrammar"

"""Structured output backend 'xgrammar' for nanocore."""
from nanocore_xgrammar.backend import XGrammarMatcher, XGrammarStructuredOutput

__all__ = ["XGrammarMatcher", "XGrammarStructuredOutput"]

"""Registers the ``xgrammar`` structured output backend."""
from nanocore.hookspecs import hookimpl
from nanocore_xgrammar.backend import XGrammarStructuredOutput


@hookimpl
def nanocore_structured_output_backends():
    return {"xgrammar": XGrammarStructuredOutput}

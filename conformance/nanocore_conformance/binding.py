"""Test a backend class directly, without registering it: ``TestMine = bind(KVCodecConformance, MyCodec)``.

Useful while writing a backend (before its entry point exists) and for the suite's own planted wrong backends.
"""
from __future__ import annotations

import pytest


def bind(base: type, cls: type, options: dict | None = None) -> type:
    """A conformance class (subclass of ``base``) testing ``cls``, optionally with backend ``options``."""
    attrs = {
        "backend": cls.__name__,
        "backend_entry": pytest.fixture(lambda self: None),
        "backend_cls": pytest.fixture(lambda self: cls),
    }
    if options is not None:
        attrs["backend_options"] = pytest.fixture(lambda self: dict(options))
    return type(f"Test{cls.__name__}", (base,), attrs)


def bind_all(module_globals: dict, base: type, classes: list[type]) -> None:
    """``bind`` every class into a test module as ``Test<Name>`` (options from a ``bound_options`` attribute)."""
    for cls in classes:
        bound = bind(base, cls, getattr(cls, "bound_options", None))
        module_globals[bound.__name__] = bound

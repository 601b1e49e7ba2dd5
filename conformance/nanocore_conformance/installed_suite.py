"""The suite for every installed backend: one generated test class per (kind, backend).

Run by ``nanocore conformance``; ``NANOCORE_CONFORMANCE_KIND`` / ``NANOCORE_CONFORMANCE_NAME`` narrow it.
A backend class may declare ``conformance_requirements = {"input_size_multiple": 128}``: every conformance class
(generated here, hand-written or scaffolded) applies them, over its own class attributes.
"""
from __future__ import annotations

import os

from nanocore.plugins import get_registry
from nanocore_conformance import CLASSES_BY_KIND


def _selected(kind: str, name: str, qualified: str) -> bool:
    want_kind = os.environ.get("NANOCORE_CONFORMANCE_KIND")
    want_name = os.environ.get("NANOCORE_CONFORMANCE_NAME")
    return (not want_kind or want_kind == kind) and (not want_name or want_name in (name, qualified))


def _class_name(kind: str, backend: str) -> str:
    safe = "".join(c if c.isalnum() else "_" for c in backend)
    return f"Test_{kind}__{safe}"


def generate() -> dict[str, type]:
    registry = get_registry()
    classes = {}
    for kind, base in CLASSES_BY_KIND.items():
        for name, entries in registry.entries[kind].items():
            for entry in entries:
                # a duplicated name is tested per distribution (and fails the uniqueness check)
                backend = entry.qualified_name if len(entries) > 1 else name
                if _selected(kind, name, entry.qualified_name):
                    # the backend's conformance_requirements are applied by the base class, as for any test class
                    classes[_class_name(kind, backend)] = type(_class_name(kind, backend), (base,), {"backend": backend})
    for failure in registry.failures:
        if not os.environ.get("NANOCORE_CONFORMANCE_KIND") and _selected("", failure.plugin, failure.distribution):
            classes[_class_name("failed_plugin", failure.plugin)] = _failed_plugin_class(failure)
    return classes


def _failed_plugin_class(failure) -> type:
    def test_plugin_loads(self):
        raise AssertionError(f"plugin {failure.plugin!r} of {failure.distribution} {failure.version} failed to load: "
                             f"{failure.error}")
    return type(_class_name("failed_plugin", failure.plugin), (), {"test_plugin_loads": test_plugin_loads})


globals().update(generate())

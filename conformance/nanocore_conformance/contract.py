"""BackendContractConformance: the registration contract every backend of every kind keeps."""
from __future__ import annotations

import pytest
import torch

from nanocore.interfaces import KINDS
from nanocore.plugins import ENTRY_POINT_GROUP, entry_points, get_registry
from nanocore_conformance.base import BackendConformance
from nanocore_conformance.surface import PUBLIC_SURFACE, imports_outside_surface, source_root


class BackendContractConformance(BackendConformance):
    """Entry point loads, name unique, supports() sane. (A wrong api_version major or a class that does not
    subclass its interface is refused by the registry, so ``backend_entry`` already fails with the reason.)

    Usable alone (``class TestX(BackendContractConformance): kind = "kv_codec"; backend = "mine"``);
    every per-kind class includes it.
    """

    def test_entry_point_loads(self, backend_entry):
        _skip_if_bound(backend_entry)
        if backend_entry.distribution == "nanocore":
            pytest.skip("builtin backend: the core registers it directly, not through an entry point")
        hook_name = KINDS[self.kind][1]
        found = []
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            dist = getattr(ep, "dist", None)
            if dist is None or dist.name != backend_entry.distribution:
                continue
            module = ep.load()
            hook = getattr(module, hook_name, None)
            if hook is not None and (hook() or {}).get(backend_entry.name) is backend_entry.cls:
                found.append(ep.name)
        assert found, (
            f"no entry point of distribution {backend_entry.distribution!r} in group {ENTRY_POINT_GROUP!r} loads "
            f"a module whose {hook_name}() returns {backend_entry.name!r}; declare it in pyproject.toml under "
            f"[project.entry-points.nanocore] and reinstall the plugin"
        )

    def test_name_unique_across_distributions(self, backend_entry):
        _skip_if_bound(backend_entry)
        entries = get_registry().entries[self.kind][backend_entry.name]
        dists = sorted(e.distribution for e in entries)
        assert len(entries) == 1, (
            f"{self.kind} {backend_entry.name!r} is registered by several distributions {dists}; rename one")

    def test_supports_returns_none_or_reason(self, backend_cls):
        for device in ("cpu", "cuda", "meta"):
            reason = backend_cls.supports(torch.device(device))
            assert reason is None or (isinstance(reason, str) and reason.strip()), (
                f"{backend_cls.__name__}.supports({device!r}) must return None or a non-empty reason, got {reason!r}")

    def test_imports_only_the_public_surface(self, backend_cls):
        if backend_cls.__module__.split(".")[0] == "nanocore":
            pytest.skip("a builtin backend is part of the core")
        root = source_root(backend_cls)
        if root is None:
            pytest.skip(f"{backend_cls.__name__} has no source file to check")
        bad = imports_outside_surface(root)
        assert not bad, (
            f"{backend_cls.__name__}'s package imports nanocore modules outside the public plugin surface "
            f"({', '.join(PUBLIC_SURFACE)}); those change without notice within 1.x. Use nanocore.toolkit "
            f"(its docstring lists what it offers):\n" + "\n".join(bad))

    def test_auto_priority_is_int_or_none(self, backend_cls):
        priority = backend_cls.auto_priority
        assert priority is None or isinstance(priority, int), (
            f"{backend_cls.__name__}.auto_priority must be an int or None, got {priority!r}")


def _skip_if_bound(backend_entry) -> None:
    if backend_entry is None:
        pytest.skip("class bound with nanocore_conformance.bind(): no registry entry to check")

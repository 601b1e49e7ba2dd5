"""Plugin registry: loads backends from the ``nanocore`` entry-point group and resolves names.

Rules (each has a test in tests/test_plugins.py):
- ``NANOCORE_PLUGINS=a,b`` allows only those plugins (entry-point or distribution names);
  ``NANOCORE_DISABLE_PLUGINS=c`` blocks some. The builtins always load: they are the oracles.
- A plugin that fails to import (or whose hook raises) is recorded with its error and skipped.
- Two distributions registering one name for one kind is an error naming both, raised when that
  name is used; ``"distribution:name"`` picks one explicitly.
- Compatibility comes from what the plugin declares: an ``api_version`` set on its own class (not inherited from
  nanocore's classes), and its distribution's requirement on ``nanocore-llm``. Another major version, a newer minor
  than this core implements, or a requirement this nanocore does not meet is refused with a message; a plugin
  that declares neither loads with a warning.
- ``resolve(kind, "auto", device)`` picks the highest ``auto_priority`` backend whose
  ``supports(device)`` passes and logs what it chose; an explicit unsupported name fails with the reason.
- Loading is idempotent, and every process (TP workers too) loads from entry points itself.
- ``build(kind, name, device, options, **context)`` is the one place backends are constructed:
  ``cls(*context, options=options)`` (context: ``block_size, num_blocks`` for prefix caches, positional as the
  interface's constructor lists them), logged once per backend.
"""
from __future__ import annotations

import difflib
import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import pluggy
import torch

from nanocore import hookspecs
from nanocore.interfaces import KINDS, Backend
from nanocore.interfaces.base import INJECTED_OPTIONS
from nanocore._version import __version__
from nanocore.plugin_versions import compatibility_problem

if sys.version_info >= (3, 12):
    from importlib.metadata import entry_points
else:  # the backport has the same selectable API on 3.10 / 3.11
    try:
        from importlib_metadata import entry_points
    except ImportError:
        from importlib.metadata import entry_points

logger = logging.getLogger("nanocore")

ENTRY_POINT_GROUP = "nanocore"
AUTO = "auto"


class BackendError(ValueError):
    """A backend name cannot be used: unknown, ambiguous, refused or unsupported here."""


@dataclass(frozen=True)
class BackendEntry:
    kind: str
    name: str
    cls: type[Backend]
    distribution: str
    version: str
    plugin: str

    @property
    def qualified_name(self) -> str:
        return f"{self.distribution}:{self.name}"


@dataclass(frozen=True)
class PluginFailure:
    plugin: str
    distribution: str
    version: str
    error: str


@dataclass
class Registry:
    entries: dict[str, dict[str, list[BackendEntry]]] = field(default_factory=dict)
    refused: dict[str, dict[str, str]] = field(default_factory=dict)
    failures: list[PluginFailure] = field(default_factory=list)
    plugin_manager: pluggy.PluginManager | None = None
    logged: set = field(default_factory=set)  # backends whose construction -v has reported

    # ---- loading -------------------------------------------------------------------------
    @classmethod
    def load(cls) -> Registry:
        registry = cls(entries={k: {} for k in KINDS}, refused={k: {} for k in KINDS})
        pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        pm.add_hookspecs(hookspecs)
        registry.plugin_manager = pm
        from nanocore import builtin

        sources: dict[str, tuple[str, str]] = {}  # plugin name -> (distribution, version)
        requirements: dict[str, list[str]] = {}  # plugin name -> its distribution's requirements
        pm.register(builtin, name="builtin")
        sources["builtin"] = (builtin.BUILTIN_DISTRIBUTION, __version__)
        allow = _env_list("NANOCORE_PLUGINS")
        block = _env_list("NANOCORE_DISABLE_PLUGINS")
        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            dist_name = ep.dist.name if getattr(ep, "dist", None) else ep.name
            dist_ver = ep.dist.version if getattr(ep, "dist", None) else "?"
            ids = {ep.name, dist_name}
            if (allow is not None and not ids & allow) or ids & block:
                logger.debug("plugin %s (%s) not loaded: excluded by NANOCORE_PLUGINS / NANOCORE_DISABLE_PLUGINS", ep.name, dist_name)
                continue
            # two distributions may use one entry-point name: keep both, under distinct plugin names
            plugin_name = ep.name if sources.get(ep.name, (dist_name,))[0] == dist_name else f"{dist_name}:{ep.name}"
            if plugin_name in sources:
                continue  # same distribution seen twice (e.g. editable + regular install)
            try:
                module = ep.load()
                pm.register(module, name=plugin_name)
            except Exception as exc:  # a broken plugin must not break the others
                registry.failures.append(PluginFailure(plugin_name, dist_name, dist_ver, f"{type(exc).__name__}: {exc}"))
                logger.warning("plugin %s from %s failed to load: %s", ep.name, dist_name, exc)
                continue
            sources[plugin_name] = (dist_name, dist_ver)
            requirements[plugin_name] = list(getattr(getattr(ep, "dist", None), "requires", None) or [])
        for kind, (interface, hook_name) in KINDS.items():
            for impl in getattr(pm.hook, hook_name).get_hookimpls():
                distribution, version = sources[impl.plugin_name]
                registry._collect(kind, interface, impl, distribution, version, requirements.get(impl.plugin_name))
        return registry

    def _collect(self, kind, interface, impl, distribution, version, requires: list[str] | None) -> None:
        try:
            backends = impl.function() or {}
        except Exception as exc:
            self.failures.append(PluginFailure(impl.plugin_name, distribution, version, f"{type(exc).__name__}: {exc}"))
            return
        for name, cls in backends.items():
            reason = _refusal_reason(kind, interface, name, cls, impl.plugin_name)
            if reason is None and requires is not None:  # builtins (requires None) are the core itself
                reason = compatibility_problem(kind, name, cls, impl.plugin_name, distribution, requires)
            if reason:
                self.refused[kind][name] = reason
                logger.warning(reason)
                continue
            cls.name = name
            entry = BackendEntry(kind, name, cls, distribution, version, impl.plugin_name)
            self.entries[kind].setdefault(name, []).append(entry)

    # ---- lookup --------------------------------------------------------------------------
    def names(self, kind: str) -> list[str]:
        _check_kind(kind)
        return sorted(self.entries[kind])

    def get(self, kind: str, name: str) -> BackendEntry:
        """The backend registered as ``name`` (or ``distribution:name``) for ``kind``."""
        _check_kind(kind)
        distribution, _, short = name.rpartition(":")
        candidates = self.entries[kind].get(short, [])
        if distribution:
            candidates = [e for e in candidates if e.distribution == distribution]
        if not candidates:
            if short in self.refused[kind]:
                raise BackendError(self.refused[kind][short])
            raise BackendError(unknown_name_message(kind, name, self.names(kind)))
        if len(candidates) > 1:
            dists = " and ".join(repr(e.distribution) for e in candidates)
            picks = ", ".join(repr(e.qualified_name) for e in candidates)
            raise BackendError(
                f"{kind} {short!r} is registered by two distributions, {dists}; pick one explicitly "
                f"({picks}) or uninstall one / exclude it with NANOCORE_DISABLE_PLUGINS"
            )
        return candidates[0]

    def resolve(self, kind: str, name: str, device: torch.device | str) -> BackendEntry:
        """Entry for ``name`` usable on ``device``; ``"auto"`` picks the best supported one."""
        device = torch.device(device)
        if name != AUTO:
            entry = self.get(kind, name)
            reason = entry.cls.supports(device)
            if reason:
                raise BackendError(f"{kind} {name!r} cannot run on {device}: {reason}")
            return entry
        ranked = sorted(
            (e for entries in self.entries[kind].values() for e in entries if e.cls.auto_priority is not None),
            key=lambda e: -e.cls.auto_priority,
        )
        skipped = []
        for entry in ranked:
            reason = entry.cls.supports(device)
            if reason is None:
                note = f" (skipped: {'; '.join(skipped)})" if skipped else ""
                logger.info("auto %s: chose %r on %s%s", kind, entry.name, device, note)
                return entry
            skipped.append(f"{entry.name}: {reason}")
        raise BackendError(f"no installed {kind} supports {device}: {'; '.join(skipped) or 'none installed'}")

    def build(self, kind: str, name: str, device: torch.device | str, options: dict[str, Any] | None = None,
              *context: Any) -> Backend:
        """Resolve ``name`` (or ``auto``) for ``device`` and construct it: ``cls(*context, options=options)``."""
        return self.instantiate(self.resolve(kind, name, device), options, *context)

    def instantiate(self, entry: BackendEntry, options: dict[str, Any] | None = None, *context: Any) -> Backend:
        """Construct a resolved entry with the one calling convention; log the choice once per backend."""
        options = dict(options or {})
        shown = {k: v for k, v in options.items() if k not in INJECTED_OPTIONS}
        key = (entry.kind, entry.qualified_name, repr(sorted(shown.items())))
        if key not in self.logged:
            self.logged.add(key)
            logger.info("%s: %r from %s %s%s", entry.kind, entry.name, entry.distribution, entry.version,
                        f" with options {shown}" if shown else "")
        return entry.cls(*context, options=options)

    def rows(self, device: torch.device | str = "cpu") -> list[dict[str, Any]]:
        """One dict per backend (and refusal), as printed by ``nanocore plugins``."""
        device = torch.device(device)
        rows = []
        for kind in KINDS:
            for name in sorted(self.entries[kind]):
                for entry in self.entries[kind][name]:
                    reason = entry.cls.supports(device)
                    if len(self.entries[kind][name]) > 1:
                        reason = f"name registered by several distributions; select '{entry.qualified_name}'"
                    rows.append({"kind": kind, "name": name, "distribution": entry.distribution,
                                 "version": entry.version, "supported": reason is None, "reason": reason})
            for name, why in sorted(self.refused[kind].items()):
                rows.append({"kind": kind, "name": name, "distribution": None, "version": None,
                             "supported": False, "reason": why})
        return rows


_registry: Registry | None = None
_lock = threading.Lock()


def get_registry() -> Registry:
    """The process-wide registry, loaded on first use (idempotent)."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = Registry.load()
        return _registry


def build_backend(kind: str, config, device: torch.device | str, *context):
    """The backend of ``kind`` that ``config`` (an ``EngineConfig``) names, with its options, built by the registry
    (``auto`` resolved for ``device``); ``context`` as ``Registry.build`` takes it."""
    name, options = config.backend(kind)
    return get_registry().build(kind, name, device, options, *context)


def reload_registry() -> Registry:
    """Forget the loaded registry and load again (after installing plugins, or in tests)."""
    global _registry
    with _lock:
        _registry = None
    return get_registry()


def unknown_name_message(kind: str, name: str, installed: list[str]) -> str:
    close = difflib.get_close_matches(name, installed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return (f"unknown {kind} {name!r}: installed {kind} backends are {installed} (or 'auto'){hint} "
            f"Run 'nanocore plugins' to see every backend and failed plugin.")


def _refusal_reason(kind, interface, name, cls, plugin) -> str | None:
    if not (isinstance(cls, type) and issubclass(cls, interface)):
        return f"plugin {plugin!r} registers {kind} {name!r} as {cls!r}, which does not subclass nanocore.interfaces.{interface.__name__}"
    return None


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise BackendError(f"unknown backend kind {kind!r}; kinds are {list(KINDS)}")


def _env_list(var: str) -> set[str] | None:
    raw = os.environ.get(var)
    if raw is None:
        return None if var == "NANOCORE_PLUGINS" else set()
    return {item.strip() for item in raw.split(",") if item.strip()}


"""Which contract minor a backend was written for, so the suite holds it to that minor's rules (the 1.x promise).

A rule added in a later minor is checked only for backends targeting that minor or newer; an older backend passes
under the rules of its own minor and gets a ``DeprecationWarning`` saying exactly what to add to move on.
"""
from __future__ import annotations

import warnings
from importlib import metadata

from nanocore.interfaces import API_VERSION
from nanocore.plugin_versions import targeted_api_version


def distribution_requires(backend_entry) -> list[str] | None:
    """The requirements of the distribution that registered ``backend_entry`` (None for builtins, bound classes)."""
    if backend_entry is None or backend_entry.distribution == "nanocore":
        return None
    try:
        return list(metadata.distribution(backend_entry.distribution).requires or [])
    except metadata.PackageNotFoundError:
        return None


def targeted_minor(backend_cls: type, backend_entry) -> tuple[int, int]:
    """(major, minor) the backend targets: its ``api_version``, else its distribution's nanocore floor."""
    return targeted_api_version(backend_cls, distribution_requires(backend_entry))


def warn_legacy(backend_cls: type, what: str) -> None:
    """One deprecation warning per backend and rule: what an older backend relies on and what to add."""
    warnings.warn(f"{backend_cls.__name__}: {what} (this nanocore implements plugin API {API_VERSION})",
                  DeprecationWarning, stacklevel=2)

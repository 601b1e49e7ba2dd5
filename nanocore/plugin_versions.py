"""Is a plugin's backend written for this nanocore? Decided from what the plugin itself declares.

Two declarations count: ``api_version = "MAJOR.MINOR"`` set on the backend's own class (or a base class of the
plugin's; the value nanocore's interfaces carry is not the plugin's word), and the distribution's requirement on
nanocore, under its distribution name ``nanocore-llm`` (``nanocore-llm>=1.1,<2``) or the name ``nanocore`` that
plugins written before the rename require. The contract promises: same major and a minor this core implements works.
"""
from __future__ import annotations

import logging
import warnings

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from nanocore._version import __version__
from nanocore.interfaces import API_VERSION

logger = logging.getLogger("nanocore")

#: The core's distribution name (``nanocore`` on the package index is an unrelated project), then the name plugins
#: written before the rename require: a requirement on either is a requirement on this core.
CORE_DISTRIBUTIONS = ("nanocore-llm", "nanocore")


def declared_api_version(cls: type) -> str | None:
    """``api_version`` as set by the plugin's own classes; None if only nanocore's classes set it."""
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] == "nanocore":
            continue  # the interfaces and the reference backends carry the core's own version
        if "api_version" in vars(klass):
            return str(vars(klass)["api_version"])
    return None


def nanocore_requirement(requires: list[str]) -> Requirement | None:
    """The distribution's requirement on nanocore (markers ignored), or None."""
    for line in requires:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(requirement.name) in CORE_DISTRIBUTIONS and not requirement.extras:
            return requirement
    return None


def api_version_problem(declared: str) -> str | None:
    """Why a declared ``api_version`` cannot run on this core's ``API_VERSION``, or None."""
    try:
        major, minor = (int(part) for part in declared.split(".")[:2])
    except ValueError:
        return f"api_version {declared!r} is not 'MAJOR.MINOR' (this nanocore implements {API_VERSION!r})"
    core_major, core_minor = (int(part) for part in API_VERSION.split("."))
    if major != core_major:
        return (f"it declares api_version {declared!r}, written for nanocore's plugin API {major}.x, but this "
                f"nanocore implements {API_VERSION!r}: install a release of the plugin built for API "
                f"{core_major}.x, or a nanocore of major {major}")
    if minor > core_minor:
        return (f"it declares api_version {declared!r}, newer than the {API_VERSION!r} this nanocore implements: "
                f"upgrade nanocore")
    return None


def compatibility_problem(kind: str, name: str, cls: type, plugin: str, distribution: str,
                          requires: list[str]) -> str | None:
    """The refusal message for a backend that is not written for this nanocore, else None (maybe warning)."""
    what = f"plugin {plugin!r} ({distribution}) {kind} {name!r}"
    declared = declared_api_version(cls)
    if declared is not None:
        problem = api_version_problem(declared)
        if problem:
            return f"{what} is refused: {problem}"
    requirement = nanocore_requirement(requires)
    if requirement is not None and requirement.specifier:
        try:
            admitted = requirement.specifier.contains(Version(__version__), prereleases=True)
        except InvalidVersion:
            admitted = True
        if not admitted:
            return (f"{what} is refused: its distribution requires {requirement} but this is nanocore {__version__} "
                    f"(plugin API {API_VERSION}); install a release of {distribution} made for this nanocore")
    elif declared is None:
        message = (f"{what} declares no api_version and its distribution does not pin nanocore: assumed to target "
                   f"plugin API {API_VERSION.split('.')[0]}.x. Declare `api_version = \"{API_VERSION}\"` on the "
                   f"class, or require 'nanocore-llm>={API_VERSION},<{int(API_VERSION.split('.')[0]) + 1}'")
        logger.warning(message)
        warnings.warn(message, DeprecationWarning, stacklevel=2)
    return None


def targeted_api_version(cls: type, requires: list[str] | None = None) -> tuple[int, int]:
    """(major, minor) of the plugin API a backend was written for: its own ``api_version``, else the lowest nanocore
    its distribution admits (``nanocore-llm>=1.1``), else this core's. Rules added in later minors spare older ones."""
    declared = declared_api_version(cls)
    if declared is None and requires:
        requirement = nanocore_requirement(requires)
        floors = [s.version for s in (requirement.specifier if requirement else ()) if s.operator in (">=", "~=", "==")]
        declared = floors[0] if floors else None
    try:
        major, minor = (int(part) for part in (declared or API_VERSION).split(".")[:2])
    except ValueError:
        major, minor = (int(part) for part in API_VERSION.split("."))
    return major, minor

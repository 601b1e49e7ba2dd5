"""The whole plugin contract of nanocore. Read this file first.

A plugin is a module with one or more ``@hookimpl`` functions, exposed through the ``nanocore``
entry-point group of its distribution::

    [project.entry-points.nanocore]
    my_backend = "my_package.plugin"

Each hook returns ``{name: backend_class}`` for one of the five extension points. The class
subclasses the matching interface in ``nanocore.interfaces`` and declares ``api_version``.
Users then select the backend by name: ``LLM(model, linear_method="my_backend")``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from nanocore.interfaces import (
        KVCodec,
        LinearMethod,
        MoEExecutor,
        PrefixCache,
        SchedulerPolicy,
    )

PROJECT_NAME = "nanocore"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def nanocore_linear_methods() -> dict[str, type[LinearMethod]]:
    """Weight formats and the GEMMs that consume them (one instance per linear layer)."""


@hookspec
def nanocore_kv_codecs() -> dict[str, type[KVCodec]]:
    """KV-cache storage formats: layout, allocation, store, dequantizing gather."""


@hookspec
def nanocore_prefix_caches() -> dict[str, type[PrefixCache]]:
    """Block-level prefix caches: match / insert / evict of computed KV blocks."""


@hookspec
def nanocore_moe_executors() -> dict[str, type[MoEExecutor]]:
    """Expert computation of a MoE layer, given routed tokens and stacked expert weights."""


@hookspec
def nanocore_scheduler_policies() -> dict[str, type[SchedulerPolicy]]:
    """Which sequences run this step, and how many tokens each."""

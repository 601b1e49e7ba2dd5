"""The whole plugin contract of nanocore. Read this file first.

A plugin is a module with one or more ``@hookimpl`` functions, exposed through the ``nanocore``
entry-point group of its distribution::

    [project.entry-points.nanocore]
    my_backend = "my_package.plugin"

Each hook returns ``{name: backend_class}`` for one of the six extension points. The class
subclasses the matching interface in ``nanocore.interfaces`` (each module there states its whole contract:
constructor, calls, shapes, what must be CUDA-graph safe) and declares ``api_version = "1.6"`` on itself, or
its distribution requires ``nanocore-llm>=1.6,<2``. Users then select the backend by name:
``LLM(model, linear_method="my_backend")``.

The public plugin surface is this module, ``nanocore.interfaces`` and ``nanocore.toolkit`` (reusable
building blocks: quantization references, GEMMs, KV store, prefix-cache helpers, capability checks, the
reference backends). Nothing else of ``nanocore`` is stable for plugins. ``nanocore plugin new`` writes a
distribution to start from; ``nanocore-conformance`` tells whether a backend keeps the contract.
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
        StructuredOutputBackend,
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


@hookspec
def nanocore_structured_output_backends() -> dict[str, type[StructuredOutputBackend]]:
    """Constrained decoding: compile a JSON schema / regex / grammar / choice list, fill token bitmasks (since 1.5)."""


@hookspec
def nanocore_env_vars() -> list[str]:
    """Optional: the ``NANOCORE_*`` environment variables this plugin reads that are not engine config fields (its
    cache or build directory, say), so the core never warns about them as misspelled fields. A core older than
    this hook ignores it."""

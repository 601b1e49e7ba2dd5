"""What every backend class of every kind declares."""
from __future__ import annotations

from typing import Any, ClassVar

import torch

# Major version bumps when an interface changes incompatibly, minor when one grows; plugins declare the version
# they target (``api_version`` on their class, or their distribution's requirement on nanocore).
API_VERSION = "1.6"
#: Options the core adds itself, not the user: a linear method loading a quantized checkpoint gets the
#: checkpoint's ``quantization_config`` dict. ``check_options`` always accepts them.
INJECTED_OPTIONS: dict[str, type] = {"quantization_config": dict}


class Backend:
    """Base of the six interfaces: a name, the API version it targets, options and capabilities."""

    #: Plugin API version this backend was written against ("MAJOR.MINOR"). Set it on your own class: the
    #: registry reads it from the plugin's classes only (the value here is the core's, not a declaration).
    api_version: ClassVar[str] = API_VERSION
    #: Set by the registry to the name the backend was registered under.
    name: ClassVar[str] = ""
    #: Rank used by ``"auto"`` selection (highest supported wins); ``None`` = never chosen automatically.
    auto_priority: ClassVar[int | None] = None

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = dict(options or {})

    @classmethod
    def supports(cls, device: torch.device) -> str | None:
        """Return ``None`` if this backend can run on ``device``, else the reason it cannot."""
        return None


def check_options(backend: str, options: dict[str, Any], allowed: dict[str, type]) -> dict[str, Any]:
    """Validate a backend's options dict: unknown keys and wrong types are user errors. The core's
    ``INJECTED_OPTIONS`` are always allowed (a method that does not read them may ignore them)."""
    unknown = sorted(set(options) - set(allowed) - set(INJECTED_OPTIONS))
    if unknown:
        raise ValueError(
            f"backend {backend!r} got unknown option(s) {unknown}; allowed options: {sorted(allowed) or 'none'}"
        )
    allowed = {**INJECTED_OPTIONS, **allowed}
    for key, value in options.items():
        # bool is an int subclass in Python; True is never a meaningful count or size
        wrong_bool = isinstance(value, bool) and allowed[key] is not bool
        if wrong_bool or not isinstance(value, allowed[key]):
            raise ValueError(
                f"backend {backend!r} option {key!r} must be {allowed[key].__name__}, got {value!r}"
            )
    return options


def builtin_options(backend: Any, owner: type, name: str, options: dict[str, Any] | None,
                    allowed: dict[str, type]) -> dict[str, Any]:
    """Options of a built-in backend: checked against ``allowed`` unless ``backend`` is a subclass with an
    ``__init__`` of its own (it may take options of its own: it passes them up and validates them itself)."""
    options = dict(options or {})
    if type(backend).__init__ is not owner.__init__:
        return options
    return check_options(name if type(backend) is owner else (backend.name or type(backend).__name__), options, allowed)


def choice_option(backend: str, options: dict[str, Any], key: str, choices: tuple[str, ...]) -> str:
    """``options[key]`` (default: the first choice) if it is one of ``choices``, else a ValueError naming them."""
    value = options.get(key, choices[0])
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"
        raise ValueError(f"{backend}: option {key} must be {listed}, got {value!r}")
    return value


# kept here for plugins written against 1.0; the toolkit is their home now
from nanocore.toolkit.capability import cuda_capability_reason, triton_reason  # noqa: E402,F401

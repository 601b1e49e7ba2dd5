"""Which linear method loads a checkpoint: each installed method's ``checkpoint_support`` decides, not a name table.

``auto`` takes, among the methods that load the checkpoint and run on the device, the highest
``checkpoint_priority_for``; an explicit name that cannot load it fails with its reason and the names that can.
The choice and its reason are logged at INFO (``nanocore -v``).
"""
from __future__ import annotations

import logging

import torch

from nanocore.plugins import AUTO, BackendEntry, get_registry
from nanocore.toolkit.checkpoint import CheckpointFormatError
from nanocore.toolkit.checkpoint_formats import parse_quantization_config

logger = logging.getLogger("nanocore")


def quantization_config(hf_config) -> dict | None:
    qc = getattr(hf_config, "quantization_config", None)
    if qc is not None and not isinstance(qc, dict):
        qc = qc.to_dict()
    return qc or None


def checkpoint_summary(qc: dict | None) -> str:
    """One phrase for messages: what the checkpoint holds."""
    if qc is None:
        return "an unquantized checkpoint"
    try:
        fmt = parse_quantization_config(qc)
    except CheckpointFormatError as exc:
        return f"a {qc.get('quant_method')!r} checkpoint ({exc})"
    return f"a {fmt.describe()} checkpoint" if fmt.groups else f"a {qc.get('quant_method')!r} checkpoint"


def support_of(entry: BackendEntry, qc: dict | None) -> str | None:
    """The method's own verdict; a method whose check raises cannot load the checkpoint (the error is the reason)."""
    try:
        return entry.cls.checkpoint_support(qc)
    except Exception as exc:  # a third party's check must not take routing down
        return f"its checkpoint_support raised {type(exc).__name__}: {exc}"


def resolve_linear_method(name: str, options: dict, hf_config, device: torch.device) -> tuple[BackendEntry, dict]:
    """The linear-method entry for this checkpoint, and its options (plus the checkpoint's quantization_config)."""
    registry, qc = get_registry(), quantization_config(hf_config)
    device = torch.device(device)
    if qc is not None:
        parse_quantization_config(qc)  # an unreadable config is its own clear error, before any method is asked
    entries = sorted((e for es in registry.entries["linear_method"].values() for e in es), key=lambda e: e.name)
    verdicts = {e.name: support_of(e, qc) for e in entries}
    loaders = [e for e in entries if verdicts[e.name] is None]
    what = checkpoint_summary(qc)
    if name != AUTO:
        entry = registry.resolve("linear_method", name, device)
        reason = verdicts.get(entry.name, support_of(entry, qc)) if qc is not None else None
        if reason is not None:  # a plain config: dummy weights take any method (load_model checks real folders)
            others = [e.name for e in loaders if e.name != entry.name]
            hint = (f"use linear_method='auto' or one of {others}" if others else
                    "no installed linear method loads it ('nanocore plugins' lists them; a plugin for this format "
                    "may need installing)")
            raise ValueError(f"linear_method {name!r} cannot load {what}: {reason}; {hint}")
        logger.info("linear_method %r (named) loads %s", entry.name, what)
    elif qc is None:
        entry = registry.resolve("linear_method", "unquantized", device)
        logger.info("auto linear_method: %r for %s", entry.name, what)
    else:
        entry = best_loader(loaders, verdicts, qc, device, what)
    options = dict(options)
    if qc is not None:
        options.setdefault("quantization_config", qc)
    return entry, options


def best_loader(loaders: list[BackendEntry], verdicts: dict[str, str | None], qc: dict, device: torch.device,
                what: str) -> BackendEntry:
    if not loaders:
        reasons = "; ".join(f"{n}: {r}" for n, r in verdicts.items())
        raise ValueError(f"the checkpoint has quant_method {qc.get('quant_method')!r} ({what}) but no installed linear "
                         f"method loads it ({reasons}); install the nanocore plugin for this format ('nanocore "
                         f"plugins' lists what is installed)")
    runs = {e.name: e.cls.supports(device) for e in loaders}
    usable = [e for e in loaders if runs[e.name] is None]
    if not usable:
        raise ValueError(f"the linear methods that load {what} cannot run on {device}: "
                         + "; ".join(f"{n}: {r}" for n, r in runs.items()))
    chosen = max(usable, key=lambda e: e.cls.checkpoint_priority_for(qc))  # ties: the first by name
    ranked = ", ".join(f"{e.name} ({e.cls.checkpoint_priority_for(qc)})" for e in usable)
    skipped = [f"{n}: {r}" for n, r in runs.items() if r is not None]
    logger.info("auto linear_method: %r for %s; loaders by checkpoint_priority_for: %s%s", chosen.name, what, ranked,
                f"; cannot run here: {'; '.join(skipped)}" if skipped else "")
    return chosen

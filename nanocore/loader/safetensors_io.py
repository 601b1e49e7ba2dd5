"""Stream (name, tensor) pairs out of a safetensors checkpoint, single-file or sharded.

Tensors are read one at a time from memory-mapped files, so a checkpoint is never held twice.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from nanocore.models.base import CheckpointError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of ``model_dir``, checking that every shard of an index exists."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
                raise TypeError(f"'weight_map' must map tensor names to file names, got {weight_map!r:.80}")
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index} is not a valid safetensors index ({exc}); re-download the checkpoint") from None
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (model_dir / f).is_file()]
        if missing:
            raise CheckpointError(
                f"checkpoint shard(s) {missing} listed in {index} are missing from {model_dir}; "
                f"the download is incomplete: download those files again")
        return [model_dir / f for f in files]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(
            f"no *.safetensors weights in {model_dir}; nanocore loads safetensors checkpoints "
            f"(convert .bin / .pt weights with transformers: model.save_pretrained(dir, safe_serialization=True))")
    return files


def iterate_weights(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield every tensor of every file, opening each lazily; corrupt files raise a CheckpointError."""
    for path in files:
        with open_safetensors(path) as handle:
            for name in handle.keys():
                try:
                    tensor = handle.get_tensor(name)
                except Exception as exc:
                    raise CheckpointError(_damaged(path, exc, name)) from None
                yield name, tensor


def open_safetensors(path: Path):
    """``safe_open`` on CPU; a truncated or corrupt file raises a CheckpointError that says so."""
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except Exception as exc:  # safetensors raises its own error type for every kind of damage
        raise CheckpointError(_damaged(path, exc)) from None


def _damaged(path: Path, exc: Exception, tensor: str | None = None) -> str:
    what = f"tensor {tensor!r} of " if tensor else ""
    return (f"cannot read {what}{path}: {exc}. The file is truncated or corrupt "
            f"(size {path.stat().st_size} bytes); download or convert it again")

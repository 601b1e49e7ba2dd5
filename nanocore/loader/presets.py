"""Architecture presets for ``dummy:PRESET``: real models' config.json, shipped in ``presets/``."""
from __future__ import annotations

import json
from pathlib import Path

PRESET_DIR = Path(__file__).parent / "presets"


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def preset_dict(name: str) -> dict:
    """The config.json contents of preset ``name``."""
    path = PRESET_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"unknown preset {name!r} in 'dummy:{name}'; available presets: {list_presets()} "
                         f"(or add a config.json as {PRESET_DIR}/NAME.json)")
    return json.loads(path.read_text())


def preset_config(name: str):
    """The transformers config object of preset ``name``."""
    from transformers import AutoConfig

    values = preset_dict(name)
    return AutoConfig.for_model(values.pop("model_type"), **values)

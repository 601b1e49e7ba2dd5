"""Checkpoints to models: safetensors (single or sharded), dummy presets, the default model."""
from nanocore.loader.default_model import default_model_path
from nanocore.loader.model_loader import LoadedModel, load_model, resolve_dtype, resolve_linear_method
from nanocore.loader.presets import list_presets, preset_config

__all__ = ["LoadedModel", "default_model_path", "list_presets", "load_model", "preset_config", "resolve_dtype",
           "resolve_linear_method"]

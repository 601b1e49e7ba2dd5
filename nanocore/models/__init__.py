"""Model definitions, chosen by the HF config's ``architectures``."""
from nanocore.models.base import CausalLMBase, CheckpointError, ModelBuildContext, check_all_loaded
from nanocore.models.registry import ARCHITECTURES, build_model, model_class, supported_architectures

__all__ = ["ARCHITECTURES", "CausalLMBase", "CheckpointError", "ModelBuildContext", "build_model",
           "check_all_loaded", "model_class", "supported_architectures"]

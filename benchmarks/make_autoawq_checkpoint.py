"""Checkpoints written by AutoAWQ 0.2.9 itself (GEMM, zero points), in AutoAWQ's own environment.

    python -m venv /work/venv-awq && /work/venv-awq/bin/pip install --no-deps autoawq==0.2.9 (+ torch,
        transformers 4.51.3, accelerate, datasets)
    /work/venv-awq/bin/python benchmarks/make_autoawq_checkpoint.py tests/data/producers/llama_autoawq_gemm
    /work/venv-awq/bin/python benchmarks/make_autoawq_checkpoint.py OUT --smollm2 CALIB_TEXT [SAMPLES]

The first is a tiny random Llama (g128) with ``reference_logits.pt``: a float32 copy holding what AutoAWQ's own
``dequantize_gemm`` reads. ``--smollm2`` quantizes SmolLM2-135M (group 64: 576 is no multiple of 128, which AutoAWQ
asserts) on SAMPLES (default 32) random 512-token windows of ``CALIB_TEXT`` (seed 0, as ``nanocore quantize
--calib-text`` draws them) and writes ``OUT/smollm2_autoawq_g64`` plus ``OUT/smollm2_autoawq_g64_dequant``, a float32
checkpoint of the same weights (every linear through ``dequantize_gemm``, the norms AutoAWQ's scale search rewrote):
the int4 gate's reference in docs/benchmarks-quant.md. On a 2-core CPU a SmolLM2 layer takes 98-129 s (float32, 2
threads): about an hour for its 30 layers.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

TOKENIZER = Path.home() / ".cache/nanocore/models/SmolLM2-135M-Instruct" / "tokenizer.json"
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,  # noqa: C408
            num_key_value_heads=2, head_dim=32, vocab_size=512, max_position_embeddings=256, tie_word_embeddings=True)
QUANT_CONFIG = {"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"}


def float_model(folder: Path) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**TINY)).half()
    with torch.no_grad():  # 0.02-scale init hides rounding; larger weights make it visible
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.08)
    model.save_pretrained(folder)
    shutil.copy(TOKENIZER, folder / "tokenizer.json")


def dequantized_copy(awq_model, float_dir: Path, group_size: int, float_scales: bool = False):
    """A float32 model holding what AutoAWQ's ``dequantize_gemm`` reads from every packed linear, and the norms its
    scale search rewrote; ``float_scales``: dequantize with float32 scales (else in the checkpoint's fp16)."""
    from awq.utils.packing_utils import dequantize_gemm
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(float_dir, torch_dtype=torch.float32).eval()
    for name, module in awq_model.model.named_modules():
        if hasattr(module, "qweight"):
            scales = module.scales.float() if float_scales else module.scales
            w = dequantize_gemm(module.qweight, module.qzeros, scales, 4, group_size)
            ref.get_submodule(name).weight.data = w.t().float().cpu().contiguous()
    state = awq_model.model.state_dict()
    for name, p in ref.named_parameters():
        if "norm" in name and name in state:
            p.data = state[name].float().cpu()
    return ref


def reference_logits(awq_model, float_dir: Path) -> dict[str, torch.Tensor]:
    """Logits of a float32 copy holding what AutoAWQ's dequantize_gemm reads (its norms: the scale search moves them)."""
    ref = dequantized_copy(awq_model, float_dir, QUANT_CONFIG["q_group_size"])
    ids = torch.randint(0, TINY["vocab_size"], (16,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        return {"input_ids": ids, "logits": ref(ids[None]).logits[0].float().contiguous()}


def smollm2(out: Path, calib_text: Path, samples: int = 32, seqlen: int = 512) -> int:
    """SmolLM2-135M through AutoAWQ (float32 on CPU, group 64), and its dequantized float32 twin."""
    import time

    from awq import AutoAWQForCausalLM
    from transformers import PreTrainedTokenizerFast

    src = TOKENIZER.parent
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER))  # its tokenizer_config is transformers 5's
    ids = tokenizer(calib_text.read_text(), return_tensors="pt").input_ids[0]
    starts = torch.randint(0, ids.numel() - seqlen, (samples,), generator=torch.Generator().manual_seed(0))
    calib = [ids[s:s + seqlen].tolist() for s in starts.tolist()]
    config = {**QUANT_CONFIG, "q_group_size": 64}
    model = AutoAWQForCausalLM.from_pretrained(str(src), torch_dtype=torch.float32)
    start = time.perf_counter()
    model.quantize(tokenizer, quant_config=config, calib_data=calib, max_calib_samples=samples,
                   max_calib_seq_len=seqlen)
    print(f"AutoAWQ quantize: {time.perf_counter() - start:.0f} s")
    folder, dequant = out / "smollm2_autoawq_g64", out / "smollm2_autoawq_g64_dequant"
    for path in (folder, dequant):
        shutil.rmtree(path, ignore_errors=True)
    model.save_quantized(str(folder))
    dequantized_copy(model, src, config["q_group_size"], float_scales=True).save_pretrained(dequant)
    for tok in src.glob("tokenizer*"):
        for path in (folder, dequant):
            shutil.copy(tok, path / tok.name)
    print(folder, json.loads((folder / "config.json").read_text())["quantization_config"])
    return 0


def main(out: Path) -> int:
    from awq import AutoAWQForCausalLM
    from transformers import PreTrainedTokenizerFast

    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        float_dir = Path(tmp)
        float_model(float_dir)
        model = AutoAWQForCausalLM.from_pretrained(str(float_dir))
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(float_dir / "tokenizer.json"))
        calib = torch.randint(0, TINY["vocab_size"], (32, 64), generator=torch.Generator().manual_seed(1)).tolist()
        model.quantize(tokenizer, quant_config=QUANT_CONFIG, calib_data=calib, max_calib_samples=32,
                       max_calib_seq_len=64, n_parallel_calib_samples=4)
        model.save_quantized(str(out))
        torch.save(reference_logits(model, float_dir), out / "reference_logits.pt")
    print(out, json.loads((out / "config.json").read_text())["quantization_config"])
    return 0


if __name__ == "__main__":
    if len(sys.argv) in (4, 5) and sys.argv[2] == "--smollm2":  # OUT --smollm2 CALIB_TEXT [SAMPLES]
        sys.exit(smollm2(Path(sys.argv[1]), Path(sys.argv[3]), *map(int, sys.argv[4:])))
    sys.exit(main(Path(sys.argv[1])))

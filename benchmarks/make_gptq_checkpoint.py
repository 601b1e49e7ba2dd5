"""Checkpoints written by GPTQModel 7.6.0 itself (GPTQ v1 format, act-order ``g_idx``), on CPU, in its own venv.

    python3 -m venv /work/venv-gptq
    /work/venv-gptq/bin/pip install torch==2.13.0               # the local CPU wheel
    echo torch==2.13.0 > /tmp/pin.txt
    /work/venv-gptq/bin/pip install -c /tmp/pin.txt gptqmodel==7.6.0   # pure-Python sdist: no CUDA build
    GPTQMODEL_CPU_WORKERS=2 /work/venv-gptq/bin/python benchmarks/make_gptq_checkpoint.py tests/data/producers

(7.7.0 needs torch >= 2.14.1, which is not on this machine as a CPU wheel; 7.6.0 needs torch >= 2.8 and brings
transformers 5.24.0. On a 2-core machine GPTQModel asks for 2 "model_loader" CPU workers but sizes its CPU pool to
``(cores + 1) // 2`` = 1 and stops with "Virtual pool 'model_loader:cpu' requests 2 workers but parent 'cpu' only
has 1"; ``GPTQMODEL_CPU_WORKERS=2`` is its own override.) Each checkpoint takes about 45 s here.

Writes, for the tiny random Llama / Qwen2 of make_producer_checkpoints.py (same sizes, seed and 0.08-scale weights),
``GPTQModel.quantize`` with bits 4, ``desc_act=True`` (act-order: every layer's ``g_idx`` is a permutation of its
groups) and, but for one, ``format="gptq"`` (v1: ``qzeros`` hold zero - 1):

- ``llama_gptq_actorder``: sym, group 32;
- ``llama_gptq_actorder_asym``: asym, group 64; 4 rows of every linear are made non-negative before quantizing, so
  GPTQ's min-max (min clamped to 0) gives them zero point 0, which v1 stores as -1: GPTQModel subtracts
  0x11111111 from the whole packed word (a borrow into the next zero) and adds it back when loading;
- ``llama_gptq_v2_actorder_asym``: the same as ``format="gptq_v2"`` (``qzeros`` hold the zero points);
- ``qwen2_gptq_actorder_asym``: asym, group 32, Qwen2's q/k/v biases.

Beside each: ``reference_logits.pt`` with ``logits``: a float32 model holding what GPTQModel's own
``dequantize_weight`` reads from every quantized linear (after its own v1 -> v2 load, scales in float32: nanocore
dequantizes in float32 too), and ``forward_logits``: GPTQModel's own forward on CPU (its ``TorchLinear`` kernel,
which takes float16 / bfloat16 only; float16 here). The tokenizer GPTQModel copies in (3.4 MB) and its
``quant_log.csv`` are dropped.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from make_producer_checkpoints import REFERENCE_IDS, TOKENIZER, tiny_model

#: folder -> (architecture, group size, symmetric, GPTQModel format)
CHECKPOINTS = {
    "llama_gptq_actorder": ("llama", 32, True, "gptq"),
    "llama_gptq_actorder_asym": ("llama", 64, False, "gptq"),
    "llama_gptq_v2_actorder_asym": ("llama", 64, False, "gptq_v2"),
    "qwen2_gptq_actorder_asym": ("qwen2", 32, False, "gptq"),
}
#: rows made non-negative in the asymmetric checkpoints (zero point 0: the v1 borrow)
POSITIVE_ROWS = [0, 9, 18, 27]


def float_model(arch: str, folder: Path, positive_rows: bool) -> None:
    model = tiny_model(arch)
    if positive_rows:
        with torch.no_grad():
            for name, module in model.named_modules():
                if name.endswith("proj"):
                    module.weight[POSITIVE_ROWS] = module.weight[POSITIVE_ROWS].abs()
    model.save_pretrained(folder)
    for tok in TOKENIZER.glob("tokenizer*"):  # GPTQModel.load wants a tokenizer; ids stay < vocab
        shutil.copy(tok, folder / tok.name)


def calibration(vocab: int, samples: int = 16, seqlen: int = 64) -> list[dict]:
    ids = torch.randint(0, vocab, (samples, seqlen), generator=torch.Generator().manual_seed(1)).tolist()
    return [{"input_ids": row, "attention_mask": [1] * seqlen} for row in ids]


def reference_logits(folder: Path, float_dir: Path) -> dict[str, torch.Tensor]:
    from gptqmodel import BACKEND, GPTQModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    quantized = GPTQModel.load(str(folder), device="cpu", backend=BACKEND.TORCH, dtype=torch.float16)
    ref = AutoModelForCausalLM.from_pretrained(float_dir, dtype=torch.float32).eval()
    tensors = load_file(folder / "model.safetensors")
    for name, p in ref.named_parameters():  # embeddings, norms, biases: as written (bf16 -> float32 is exact)
        if name in tensors:
            p.data = tensors[name].float()
    count = 0
    for name, module in quantized.model.named_modules():
        if hasattr(module, "qweight"):
            module.scales = module.scales.float()
            ref.get_submodule(name).weight.data = module.dequantize_weight().t().float().contiguous()
            module.scales = module.scales.half()
            count += 1
    assert count, "no quantized linear found"
    with torch.no_grad():
        logits = ref(REFERENCE_IDS[None]).logits[0].float()
        forward = quantized.model(REFERENCE_IDS[None]).logits[0].float()
    return {"input_ids": REFERENCE_IDS, "logits": logits.contiguous(), "forward_logits": forward.contiguous()}


def make(out: Path, name: str) -> None:
    from gptqmodel import GPTQModel, QuantizeConfig

    arch, group, sym, fmt = CHECKPOINTS[name]
    folder = out / name
    with tempfile.TemporaryDirectory() as tmp:
        float_dir = Path(tmp) / "float"
        float_model(arch, float_dir, positive_rows=not sym)
        config = QuantizeConfig(bits=4, group_size=group, desc_act=True, sym=sym, format=fmt,
                                offload_to_disk=False)
        model = GPTQModel.load(str(float_dir), config, device="cpu")
        start = time.perf_counter()
        model.quantize(calibration(512), batch_size=4)
        print(f"{name}: GPTQModel quantize {time.perf_counter() - start:.0f} s")
        shutil.rmtree(folder, ignore_errors=True)
        model.save(str(folder))
        reference = reference_logits(folder, float_dir)  # GPTQModel.load wants the tokenizer: drop it after
        for extra in [*folder.glob("tokenizer*"), folder / "quant_log.csv"]:
            extra.unlink(missing_ok=True)
        torch.save(reference, folder / "reference_logits.pt")
    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    print(f"{name}: {qc['quant_method']} {qc['checkpoint_format']} sym={qc['sym']} group={qc['group_size']} "
          f"desc_act={qc['desc_act']} {sum(f.stat().st_size for f in folder.iterdir()) // 1024} kB")


def main(out: Path, names: list[str]) -> int:
    out = out.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # GPTQModel writes a logs/ folder into the working directory
        for name in names or CHECKPOINTS:
            make(out, name)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:]))

"""Checkpoints written by GPTQModel 7.6.0 itself (GPTQ v1 format, act-order ``g_idx``), on CPU, in its own venv.

    python3 -m venv /work/venv-gptq
    /work/venv-gptq/bin/pip install torch==2.13.0               # the local CPU wheel
    echo torch==2.13.0 > /tmp/pin.txt
    /work/venv-gptq/bin/pip install -c /tmp/pin.txt gptqmodel==7.6.0   # pure-Python sdist: no CUDA build
    GPTQMODEL_CPU_WORKERS=2 /work/venv-gptq/bin/python benchmarks/make_gptq_checkpoint.py tests/data/producers
    GPTQMODEL_CPU_WORKERS=2 /work/venv-gptq/bin/python benchmarks/make_gptq_checkpoint.py OUT --smollm2 CALIB_TEXT [N]

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

``--smollm2`` quantizes SmolLM2-135M (4-bit, group 64 since 576 is no multiple of 128, act-order, sym, v1) on N
(default 32) random 512-token windows of CALIB_TEXT (seed 0, as ``nanocore quantize --calib-text`` draws them; 172 s
on this 2-core CPU) into ``OUT/smollm2_gptqmodel_g64`` and writes ``OUT/smollm2_gptqmodel_g64_dequant``, its float32
twin (GPTQModel's own ``dequantize_weight``): the int4 gate's reference in docs/benchmarks-quant.md.
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


def smollm2(out: Path, calib_text: Path, samples: int = 32, seqlen: int = 512) -> int:
    """SmolLM2-135M through GPTQModel (4-bit, group 64, act-order, sym, v1) and its dequantized float32 twin."""
    from gptqmodel import GPTQModel, QuantizeConfig
    from transformers import PreTrainedTokenizerFast

    src = TOKENIZER
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(src / "tokenizer.json"))
    ids = tokenizer(calib_text.read_text(), return_tensors="pt").input_ids[0]
    starts = torch.randint(0, ids.numel() - seqlen, (samples,), generator=torch.Generator().manual_seed(0))
    calib = [{"input_ids": ids[s:s + seqlen].tolist(), "attention_mask": [1] * seqlen} for s in starts.tolist()]
    folder, dequant = out / "smollm2_gptqmodel_g64", out / "smollm2_gptqmodel_g64_dequant"
    config = QuantizeConfig(bits=4, group_size=64, desc_act=True, sym=True, format="gptq", offload_to_disk=False)
    model = GPTQModel.load(str(src), config, device="cpu")
    start = time.perf_counter()
    model.quantize(calib, batch_size=4)
    print(f"GPTQModel quantize SmolLM2: {time.perf_counter() - start:.0f} s")
    for path in (folder, dequant):
        shutil.rmtree(path, ignore_errors=True)
    model.save(str(folder))
    dequantized_twin(folder, src, dequant)
    print(folder, dequant)
    return 0


def dequantized_twin(folder: Path, src: Path, dequant: Path) -> None:
    """A float32 copy of ``folder``: every quantized linear as GPTQModel's ``dequantize_weight`` reads it (float32
    scales), every other tensor as GPTQModel wrote it (it saves embeddings and norms in bfloat16)."""
    from gptqmodel import BACKEND, GPTQModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    quantized = GPTQModel.load(str(folder), device="cpu", backend=BACKEND.TORCH, dtype=torch.float16)
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    tensors = {}
    for path in folder.glob("*.safetensors"):
        tensors.update(load_file(path))
    for name, p in ref.named_parameters():
        if name in tensors:
            p.data = tensors[name].float()
    for name, module in quantized.model.named_modules():
        if hasattr(module, "qweight"):
            module.scales = module.scales.float()
            ref.get_submodule(name).weight.data = module.dequantize_weight().t().float().contiguous()
    shutil.rmtree(dequant, ignore_errors=True)
    ref.save_pretrained(dequant)
    for tok in src.glob("tokenizer*"):
        shutil.copy(tok, dequant / tok.name)


def main(out: Path, names: list[str]) -> int:
    out = out.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # GPTQModel writes a logs/ folder into the working directory
        for name in names or CHECKPOINTS:
            make(out, name)
    return 0


if __name__ == "__main__":
    if len(sys.argv) in (4, 5) and sys.argv[2] == "--smollm2":  # OUT --smollm2 CALIB_TEXT [SAMPLES]
        out_dir, text = Path(sys.argv[1]).resolve(), Path(sys.argv[3]).resolve()
        os.chdir(tempfile.mkdtemp())  # GPTQModel writes a logs/ folder into the working directory
        sys.exit(smollm2(out_dir, text, *map(int, sys.argv[4:])))
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:]))

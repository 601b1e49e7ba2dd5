"""import sys, shutil, json, torch
from pathlib import Path
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast
out = Path(sys.argv[1])
tokdir = Path.home() / ".cache/nanocore/models/SmolLM2-135M-Instruct"
float_dir = Path("/tmp/awq_float"); shutil.rmtree(float_dir, ignore_errors=True); shutil.rmtree(out, ignore_errors=True)
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=32, vocab_size=512, max_position_embeddings=256, tie_word_embeddings=True, torch_dtype="float16")
m = AutoModelForCausalLM.from_config(cfg).half()
with torch.no_grad():
    for n, p in m.named_parameters():
        if "norm" not in n: p.normal_(0, 0.08)
m.save_pretrained(float_dir)
shutil.copy(tokdir / "tokenizer.json", float_dir / "tokenizer.json")
from awq import AutoAWQForCausalLM
from awq.utils.packing_utils import dequantize_gemm
model = AutoAWQForCausalLM.from_pretrained(str(float_dir))
tok = PreTrainedTokenizerFast(tokenizer_file=str(float_dir / "tokenizer.json"))
g = torch.Generator().manual_seed(1)
calib = torch.randint(0, 512, (32, 64), generator=g).tolist()  # ids below the tiny vocabulary
model.quantize(tok, quant_config={"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"},
               calib_data=calib, max_calib_samples=32, max_calib_seq_len=64, n_parallel_calib_samples=4)
model.save_quantized(str(out))
# reference: AutoAWQ's own reading of every packed linear, in a float32 copy of the model
ref = AutoModelForCausalLM.from_pretrained(float_dir, torch_dtype=torch.float32).eval()
for name, module in model.model.named_modules():
    if hasattr(module, "qweight"):
        w = dequantize_gemm(module.qweight, module.qzeros, module.scales, 4, 128)  # [K, N]
        ref.get_submodule(name).weight.data = w.t().float().contiguous()
sd = model.model.state_dict()
for name, p in ref.named_parameters():  # AWQ's scale search rewrote norms too: take them from the quantized model
    if "norm" in name and name in sd:
        p.data = sd[name].float()
ids = torch.randint(0, 512, (16,), generator=torch.Generator().manual_seed(2))
with torch.no_grad():
    logits = ref(ids[None]).logits[0].float()
torch.save({"input_ids": ids, "logits": logits.contiguous()}, out / "reference_logits.pt")
print("saved", out, json.loads((out / "config.json").read_text()).get("quantization_config"))
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


def reference_logits(awq_model, float_dir: Path) -> dict[str, torch.Tensor]:
    """Logits of a float32 copy holding what AutoAWQ's dequantize_gemm reads (its norms: the scale search moves them)."""
    from awq.utils.packing_utils import dequantize_gemm
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(float_dir, torch_dtype=torch.float32).eval()
    for name, module in awq_model.model.named_modules():
        if hasattr(module, "qweight"):
            w = dequantize_gemm(module.qweight, module.qzeros, module.scales, 4, QUANT_CONFIG["q_group_size"])
            ref.get_submodule(name).weight.data = w.t().float().contiguous()
    state = awq_model.model.state_dict()
    for name, p in ref.named_parameters():
        if "norm" in name and name in state:
            p.data = state[name].float()
    ids = torch.randint(0, TINY["vocab_size"], (16,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        return {"input_ids": ids, "logits": ref(ids[None]).logits[0].float().contiguous()}


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
    sys.exit(main(Path(sys.argv[1])))

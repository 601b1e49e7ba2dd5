"""On the GPU: after the engine's kernel warm-up no Triton kernel compiles while it serves varied work (issue 19
item 3; the full-size check is benchmarks/compile_check.py). Skips without CUDA."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from model_fixtures import make_checkpoint
    return make_checkpoint(tmp_path_factory.mktemp("warmup") / "qwen3", "qwen3", hidden_size=256,
                           intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                           num_hidden_layers=2, max_position_embeddings=1024)


def test_no_kernel_compiles_after_the_warmup(checkpoint):
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from benchmarks.compile_check import CompileRecorder, workload
    from nanocore import LLM
    recorder = CompileRecorder().install()
    try:
        llm = LLM(str(checkpoint), device="cuda", dtype="bfloat16", max_num_seqs=32, max_num_batched_tokens=512,
                  max_model_len=1024)
        recorder.arm()
        workload(llm, random.Random(1), max_len=900, decode_batches=[1, 2, 3, 5, 9, 17, 32], vocab=500)
        llm.close()
    finally:
        recorder.uninstall()
    assert recorder.early, "the hook saw no compilation at start: it is not installed"
    assert not recorder.late, "compiled after warm-up:\n" + "\n".join(recorder.late)

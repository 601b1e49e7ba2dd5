"""The throughput timeline diagnostic (benchmarks/throughput_timeline.py) on a tiny model on the CPU."""
import json

from benchmarks import throughput_timeline as tt


def test_kind_of_bins_decode_steps_by_rows():
    assert tt.kind_of(3, 17) == "prefill"
    assert tt.kind_of(1, 1) == "decode 1-16"
    assert tt.kind_of(17, 1) == "decode 17-64"
    assert tt.kind_of(256, 1) == "decode 193-256"
    assert tt.kind_of(600, 1) == "decode 513+"


def test_timeline_accounts_for_every_step(tmp_path):
    import triton
    hook_before = getattr(getattr(triton, "knobs", None), "runtime", None)
    hook_before = getattr(hook_before, "jit_post_compile_hook", None) if hook_before is not None else None
    out = tmp_path / "timeline.json"
    assert tt.main(["--model", "dummy:tiny-qwen2", "--device", "cpu", "--num-seqs", "6", "--max-len", "24",
                    "--max-model-len", "64", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    kinds, steps = data["kinds"], data["steps"]
    assert "prefill" in kinds and any(k.startswith("decode") for k in kinds)
    assert sum(k["steps"] for k in kinds.values()) == len(steps) > 0
    assert all(s["seconds"] > 0 and s["rows"] >= 1 for s in steps)
    # the steps' wall times add up to (at most) the pass's seconds
    assert sum(s["seconds"] for s in steps) <= data["seconds"] + 1e-6
    # every prompt token once, then every output token but the first (sampled from the prefill) once
    assert sum(s["tokens"] for s in steps) == data["prompt_tokens"] + data["output_tokens"] - 6
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is not None:  # the compile hook is gone again
        assert getattr(runtime, "jit_post_compile_hook", None) is hook_before

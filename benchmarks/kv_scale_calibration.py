"""Issue 17 item 3: would calibrated per-channel K scales improve the KV codecs' perplexity gates? (CPU experiment)

A calibrated K scale per (layer, KV head, channel) ``s`` is, in exact arithmetic, the same model as dividing K's
channels by ``s`` before the codec quantizes them and multiplying q's matching channels by ``s`` (q . k unchanged): a
loader could fold it into the q / k projection (or Qwen3's q_norm / k_norm) weights, so no kernel would change. RoPE
rotates channel pairs (c, c + D/2), so a pair shares one factor. This script applies exactly that in front of the
codec (q * s, k / s inside ``Attention.attend``) and runs the gate's perplexity per codec with and without it.

``s = (pair amax of K over calibration tokens) ** alpha``, normalized to geometric mean 1 per head; alpha 1 equalizes
every channel's range, 0.5 halves the spread (SmoothQuant's default). Calibration text: the corpus tokens after the
ones scored, so the scales never see the scored text.

    python -m benchmarks.kv_scale_calibration --json docs/data/kv_scale_calibration_smollm2_cpu.json
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from nanocore.layers import attention as attention_module

CODECS = ("int8", "fp8_e4m3", "k_int8_v_fp8")


class ChannelScales:
    """Wraps ``Attention.attend``: records K's per-channel amax (calibration) or applies q * s, k / s."""

    def __init__(self):
        self.amax: dict[int, torch.Tensor] = {}
        self.scales: dict[int, torch.Tensor] | None = None
        self._original = attention_module.Attention.attend

    def __enter__(self):
        def attend(layer, q, k, v, meta):
            if self.scales is None:
                seen = k.detach().abs().amax(dim=0).float()  # [kv heads, head_dim]
                old = self.amax.get(layer.layer_idx)
                self.amax[layer.layer_idx] = seen if old is None else torch.maximum(old, seen)
            else:
                s = self.scales[layer.layer_idx].to(k.dtype)
                group = layer.num_heads // layer.num_kv_heads
                q, k = q * s.repeat_interleave(group, dim=0), k / s
            return self._original(layer, q, k, v, meta)

        attention_module.Attention.attend = attend
        return self

    def __exit__(self, *exc):
        attention_module.Attention.attend = self._original

    def set_alpha(self, alpha: float) -> None:
        """Apply scales from the recorded amax from now on (alpha 0: all ones)."""
        self.scales = {}
        for layer, amax in self.amax.items():
            half = amax.shape[-1] // 2
            pair = torch.maximum(amax[:, :half], amax[:, half:]).clamp(min=1e-6)  # RoPE pairs share a factor
            s = pair ** alpha
            s = s / s.log().mean(dim=-1, keepdim=True).exp()  # geometric mean 1 per head
            self.scales[layer] = torch.cat([s, s], dim=-1)


def engine_for(codec: str, threads: int):
    from nanocore.config import EngineConfig
    from nanocore.engine.llm_engine import LLMEngine
    torch.set_num_threads(threads)
    return LLMEngine(EngineConfig(model="default", device="cpu", dtype="float32", kv_codec=codec))


def main(argv=None) -> int:
    from nanocore.eval.perplexity import load_corpus_tokens, perplexity

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-tokens", type=int, default=20480, help="scored tokens (the gate's 20,480)")
    p.add_argument("--calibration-tokens", type=int, default=4096, help="calibration tokens after the scored ones")
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.5, 1.0], help="0: no scaling")
    p.add_argument("--codecs", nargs="+", default=list(CODECS))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json")
    args = p.parse_args(argv)

    rows = []
    with ChannelScales() as scales:
        engine = engine_for("unquantized", args.threads)
        tokens = load_corpus_tokens(engine.tokenizer, None, args.max_tokens + args.calibration_tokens)
        scored, calibration = tokens[:args.max_tokens], tokens[args.max_tokens:]
        if len(calibration) < args.window:
            raise SystemExit(f"the corpus has only {len(tokens)} tokens: too few for calibration after the scored ones")
        perplexity(engine, calibration, args.window, args.window)  # records K's amax through the same forward
        baseline = perplexity(engine, scored, args.window, args.window).perplexity
        rows.append({"kv_codec": "unquantized", "alpha": 0.0, "perplexity": baseline})
        print(rows[-1], flush=True)
        del engine
        for codec in args.codecs:
            engine = engine_for(codec, args.threads)
            for alpha in args.alphas:  # alpha 0: every factor exactly 1, the codec as it is
                scales.set_alpha(alpha)
                start = time.perf_counter()
                ppl = perplexity(engine, scored, args.window, args.window).perplexity
                rows.append({"kv_codec": codec, "alpha": alpha, "perplexity": ppl,
                             "vs_unquantized": ppl / baseline - 1, "seconds": time.perf_counter() - start})
                print(rows[-1], flush=True)
            del engine
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "python -m benchmarks.kv_scale_calibration", "args": vars(args), "rows": rows,
                       "calibration_tokens": len(calibration), "scored_tokens": len(scored)}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

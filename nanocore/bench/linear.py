"""`nanocore bench linear`: every installed linear method against ``unquantized`` on one decoder layer's linears.

Each method is found through the plugin registry (third-party methods included), skipped with its
``supports()`` reason where it cannot run, given random weights through its own ``quantize`` ->
``create_weights`` -> ``weight_loader`` path and timed over M tokens. The table sums the four linears of
a layer (qkv, o, gate_up, down) per M with the speed-up over ``unquantized`` from the same run, twice on CUDA:
launched from Python (``layer_ms``) and replayed as a CUDA graph per linear (``graph_layer_ms``: without the Python
launch cost that dominates small-M kernels, but with one graph launch per linear), plus the four linears captured
in one graph (``layer_graph_ms``: back-to-back kernels, what a graph-captured decode step pays); JSON keeps
every (shape, M, method) row, the weight bytes, and errors vs the fp32 GEMM and vs the method's torch twin
(the same method with option ``kernel="torch"``, where it has one).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from nanocore.toolkit.timing import graph_time_ms

#: (N, K) of the linears of one decoder layer; "tiny" keeps K a multiple of 128 for group-wise methods.
SHAPES = {
    "qwen2.5-7b": {"qkv_proj": (4608, 3584), "o_proj": (3584, 3584), "gate_up_proj": (37888, 3584),
                   "down_proj": (3584, 18944)},
    "llama-3.1-8b": {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096),
                     "down_proj": (4096, 14336)},
    "tiny": {"qkv_proj": (192, 128), "o_proj": (128, 128), "gate_up_proj": (512, 128), "down_proj": (128, 256)},
}
BASELINE = "unquantized"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _copy_loader(param: torch.Tensor, loaded: torch.Tensor, *args, **kwargs) -> None:
    param.data.copy_(loaded)


def build_layer(entry, options: dict, weight: torch.Tensor, dtype: torch.dtype):
    """A layer of the registry's linear method ``entry`` holding ``weight`` as its checkpoint would: quantize, create,
    load, process."""
    from nanocore.plugins import get_registry

    method, layer = get_registry().instantiate(entry, options), torch.nn.Module()
    n, k = weight.shape
    try:
        tensors, _config = entry.cls.quantize({"weight": weight.to(dtype)})
    except NotImplementedError:
        tensors = {"weight": weight.to(dtype)}
    with torch.device(weight.device):
        method.create_weights(layer, k, [n], k, n, dtype, _copy_loader)
    for name, tensor in tensors.items():
        param = getattr(layer, name)
        param.weight_loader(param, tensor.to(weight.device))
    method.process_weights_after_loading(layer)
    return method, layer


def layer_bytes(layer: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*layer.parameters(), *layer.buffers()])


def time_ms(fn, device: torch.device) -> float:
    """Median milliseconds: ``triton.testing.do_bench`` on CUDA (L2 flushed between runs), wall clock on CPU."""
    if device.type == "cuda":
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=10, rep=40, return_mode="median"))
    fn()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30))


def _twin(entry, weight, dtype):
    """The same method forced onto its torch reference, or None when it has no ``kernel`` option."""
    try:
        return build_layer(entry, {"kernel": "torch"}, weight, dtype)
    except (ValueError, TypeError):
        return None


def bench_shape(methods: dict, shape: str, n: int, k: int, ms: list[int], dtype, device, seed: int = 0) -> list[dict]:
    """Rows for one linear shape: every method at every M (a failure is a row with ``error``)."""
    g = torch.Generator(device=device).manual_seed(seed)
    weight = torch.randn(n, k, device=device, generator=g) * k ** -0.5
    rows, built = [], {}
    for name, entry in methods.items():
        try:
            twin = _twin(entry, weight, dtype) if name != BASELINE else None
            built[name] = (*build_layer(entry, {}, weight, dtype), twin)
        except Exception as exc:  # report it and keep measuring the others
            rows.append({"shape": shape, "method": name, "error": f"build: {exc!r}"[:300]})
    for m in ms:
        x = torch.randn(m, k, device=device, dtype=dtype, generator=g)
        exact = x.float() @ weight.t()
        for name, (method, layer, twin) in built.items():
            row = {"shape": shape, "n": n, "k": k, "m": m, "method": name, "weight_bytes": layer_bytes(layer)}
            try:
                y = method.apply(layer, x)
                row["rel_err_vs_fp32"] = _rel_err(y, exact)
                if twin is not None:
                    row["rel_err_vs_torch_twin"] = _rel_err(y, twin[0].apply(twin[1], x))
                row["ms"] = time_ms(lambda: method.apply(layer, x), device)
                row["weight_gb_per_s"] = row["weight_bytes"] / row["ms"] / 1e6
                row["tflops"] = 2 * m * n * k / row["ms"] / 1e9
            except Exception as exc:
                row["error"] = repr(exc)[:300]
            if device.type == "cuda" and "error" not in row:
                try:
                    row["graph_ms"] = graph_time_ms(lambda: method.apply(layer, x))
                except Exception as exc:  # a method that cannot be captured: launched timing only
                    row["graph_error"] = repr(exc)[:300]
            rows.append(row)
    return rows


def layer_graph_ms(methods: dict, shapes: dict, ms: list[int], dtype, device, seed: int = 0) -> dict:
    """(method, M) -> milliseconds of the layer's four linears captured in one CUDA graph (kernels back to back,
    as a graph-captured decode step runs them), after an L2 flush; a method that fails maps to its error."""
    out: dict = {}
    for name, entry in methods.items():
        layers: list = []
        try:
            for n, k in shapes.values():
                g = torch.Generator(device=device).manual_seed(seed)
                layers.append(build_layer(entry, {}, torch.randn(n, k, device=device, generator=g) * k ** -0.5,
                                          dtype))
            for m in ms:
                xs = [torch.randn(m, k, device=device, dtype=dtype) for _, k in shapes.values()]
                out[(name, m)] = graph_time_ms(
                    lambda: [method.apply(layer, x) for (method, layer), x in zip(layers, xs)])
        except Exception as exc:  # report it and keep measuring the others
            out.update({(name, m): repr(exc)[:300] for m in ms if (name, m) not in out})
        layers.clear()
        torch.cuda.empty_cache()
    return out


def add_layer_graph(summary: list[dict], times: dict) -> None:
    """Put the one-graph layer times and their speed-up over the baseline (same run) into the summary rows."""
    for row in summary:
        t, base = times.get((row["method"], row["m"])), times.get((BASELINE, row["m"]))
        if isinstance(t, float):
            row["layer_graph_ms"] = t
            row["layer_graph_speedup"] = base / t if isinstance(base, float) else None
        elif t is not None:
            row["layer_graph_error"] = t


def summarise(rows: list[dict], names: list[str], ms: list[int]) -> list[dict]:
    """Per M and method: the layer's summed milliseconds, speed-up over the baseline, worst errors."""
    out = []
    for m in ms:
        for name in names:
            mine = [r for r in rows if r["method"] == name and r.get("m", m) == m]  # build errors have no m
            if not mine or any("ms" not in r for r in mine):
                out.append({"m": m, "method": name, "error": next((r.get("error") for r in mine), "no rows")})
                continue
            base = [r["ms"] for r in rows if r.get("m") == m and r["method"] == BASELINE and "ms" in r]
            total = sum(r["ms"] for r in mine)
            twin_errs = [r["rel_err_vs_torch_twin"] for r in mine if "rel_err_vs_torch_twin" in r]
            graph = sum(r["graph_ms"] for r in mine) if all("graph_ms" in r for r in mine) else None
            base_graph = [r["graph_ms"] for r in rows if r.get("m") == m and r["method"] == BASELINE and "graph_ms" in r]
            out.append({"m": m, "method": name, "layer_ms": total,
                        "speedup": sum(base) / total if len(base) == len(mine) else None,
                        "graph_layer_ms": graph,
                        "graph_speedup": sum(base_graph) / graph if graph and len(base_graph) == len(mine) else None,
                        "weight_mb": sum(r["weight_bytes"] for r in mine) / 1e6,
                        "max_err_vs_fp32": max(r["rel_err_vs_fp32"] for r in mine),
                        "max_err_vs_twin": max(twin_errs) if twin_errs else None})
    return out


def installed_methods(device: torch.device, wanted: list[str] | None) -> tuple[dict, dict]:
    """(name -> registry entry for methods that run here, name -> reason for those skipped); baseline first."""
    from nanocore.plugins import get_registry

    registry = get_registry()
    names = wanted or registry.names("linear_method")
    names = [BASELINE] + [n for n in names if n != BASELINE]
    methods, skipped = {}, {}
    for name in names:
        entry = registry.get("linear_method", name)
        reason = entry.cls.supports(device)
        if reason:
            skipped[name] = reason
        else:
            methods[name] = entry
    return methods, skipped


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--methods", default=None, help="comma-separated linear methods (default: all installed)")
    parser.add_argument("--shapes", default="qwen2.5-7b", choices=sorted(SHAPES), help="layer shapes (default 7B)")
    parser.add_argument("--ms", default="1,16,64,256,512,1024,4096", help="comma-separated token counts M")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                        help="activation dtype (default bfloat16 on CUDA, float32 on CPU)")
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON")


def run_from_args(args: argparse.Namespace) -> int:
    from nanocore.bench.report import environment, format_table, write_json

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but CUDA is not available; use --device cpu --shapes tiny")
    dtype = DTYPES[args.dtype or ("bfloat16" if device.type == "cuda" else "float32")]
    ms = [int(m) for m in args.ms.split(",")]
    methods, skipped = installed_methods(device, args.methods.split(",") if args.methods else None)
    for name, reason in skipped.items():
        print(f"skipped {name}: {reason}")
    rows = []
    for shape, (n, k) in SHAPES[args.shapes].items():
        rows += bench_shape(methods, shape, n, k, ms, dtype, device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    summary = summarise(rows, list(methods), ms)
    if device.type == "cuda":
        add_layer_graph(summary, layer_graph_ms(methods, SHAPES[args.shapes], ms, dtype, device))
    print(f"one {args.shapes} layer (qkv + o + gate_up + down), {dtype}, {device}")
    print(format_table(summary, ["m", "method", "layer_ms", "speedup", "graph_layer_ms", "graph_speedup",
                                 "layer_graph_ms", "layer_graph_speedup", "weight_mb",
                                 "max_err_vs_fp32",
                                 "max_err_vs_twin", "error"]))
    write_json(args.json, {"command": "bench linear", "shapes": args.shapes, "layer_shapes": SHAPES[args.shapes],
                           "dtype": str(dtype), "ms": ms, "baseline": BASELINE, "skipped": skipped,
                           "summary": summary, "rows": rows, "environment": environment(str(device))})
    return 0

"""``nanocore quantize``: write a quantized copy of a safetensors checkpoint with any linear method's ``quantize``.

The source is never modified; the output is built in a temporary folder beside DST and renamed into
place at the end, so an interrupted run leaves no half-written DST.
"""
from __future__ import annotations

import inspect
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from nanocore.toolkit.checkpoint import IGNORE_KEYS, is_ignored, quantizable_linears

_LAYER = re.compile(r"^(.*\.layers\.\d+)\.")
_SHARD_BYTES = 2 << 30


def register(subparsers) -> None:
    p = subparsers.add_parser("quantize", help="write a quantized checkpoint (fp8, int8, awq, ... any linear method)")
    p.add_argument("--method", required=True, help="linear method whose quantize() to use, e.g. fp8_w8a16, int8_w8a8, awq")
    p.add_argument("--model", required=True, help="source checkpoint folder (config.json + safetensors), or 'default'")
    p.add_argument("--out", required=True, help="destination folder (must not exist)")
    p.add_argument("--calib-text", help="text file for calibration activations (AWQ scale search, static scales)")
    p.add_argument("--calib-samples", type=int, default=32, help="calibration sequences (default 32)")
    p.add_argument("--calib-seqlen", type=int, default=512, help="tokens per calibration sequence (default 512)")
    p.add_argument("--group-size", type=int, help="group size for group-wise methods (awq: 128, or 64 if K is not a multiple)")
    p.add_argument("--fp8-scale", choices=("search", "absmax"),
                   help="fp8 methods: per-channel scale by error search (default; with --calib-text activation-weighted "
                        "and GPTQ rounding) or plain absmax / 448")
    p.add_argument("--ignore", action="append", default=[], help="layer name / glob / 're:' regex to keep unquantized")
    p.add_argument("--device", default="cpu",
                   help="where calibration and the per-layer search run: cpu (default) or cuda[:N] (the fp8 scale "
                        "search takes hours for a 7B model on CPU); the checkpoint is streamed one layer at a time")
    p.set_defaults(func=run)


def quantize_device(name: str) -> torch.device:
    from nanocore.engine.llm_engine import resolve_device

    device = resolve_device(name)  # a clear error for cuda without a GPU or beyond the machine's GPUs
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {name!r}: nanocore quantize runs on cpu or cuda[:N]")
    return device


def run(args) -> int:
    from nanocore.plugins import get_registry

    src, dst = source_folder(args.model), Path(args.out)
    device = quantize_device(getattr(args, "device", "cpu"))
    if dst.exists():
        raise ValueError(f"{dst} already exists; choose another --out or remove it first")
    try:
        config = json.loads((src / "config.json").read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{src / 'config.json'} is not valid JSON ({exc}); fix it or download the checkpoint again") from None
    if config.get("quantization_config"):
        raise ValueError(f"{src} is already quantized ({config['quantization_config'].get('quant_method')}); "
                         f"quantize the unquantized checkpoint")
    method = get_registry().get("linear_method", args.method).cls
    accepted = inspect.signature(method.quantize).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())  # it checks them itself
    for option, flag in (("fp8_scale", "--fp8-scale"), ("group_size", "--group-size")):
        if getattr(args, option, None) is not None and option not in accepted and not takes_any:
            raise ValueError(f"{args.method}'s quantize() takes no {option}, so {flag} does not apply to it")
    calibration = None
    if args.calib_text:
        calibration = collect_calibration(src, Path(args.calib_text), args.calib_samples, args.calib_seqlen, device)
    dst.parent.mkdir(parents=True, exist_ok=True)
    for leftover in dst.parent.glob(f".{dst.name}.partial-*"):  # a killed run cannot clean up after itself
        print(f"note: {leftover} is left from an interrupted run; delete it to free its space", file=sys.stderr)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.partial-", dir=dst.parent))
    try:
        extra = {} if args.group_size is None else {"group_size": args.group_size}
        if getattr(args, "fp8_scale", None) is not None:
            extra["fp8_scale"] = args.fp8_scale
        quant_config = write_quantized(src, tmp, method, calibration, args.ignore, extra, device)
        config["quantization_config"] = quant_config
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        for asset in src.iterdir():  # tokenizer, generation config, chat template ...
            if asset.is_file() and asset.suffix != ".safetensors" and asset.name not in ("config.json", "model.safetensors.index.json"):
                shutil.copy2(asset, tmp / asset.name)
        tmp.chmod(0o755)  # mkdtemp makes it private
        tmp.rename(dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"wrote {dst} ({quant_config['quant_method']}, linear method {args.method})")
    return 0


def source_folder(model: str) -> Path:
    if model == "default":
        from nanocore.loader.default_model import default_model_path
        return default_model_path()
    path = Path(model)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint folder (no config.json); pass a folder or 'default'")
    return path


def layer_groups(src: Path) -> dict[str, list[str]]:
    """Tensor names grouped by decoder layer (the unit one ``quantize`` call sees); '' holds the rest."""
    from nanocore.loader.safetensors_io import checkpoint_files, open_safetensors

    groups: dict[str, list[str]] = {}
    for file in checkpoint_files(src):
        with open_safetensors(file) as f:  # a truncated file: a CheckpointError naming it, not a traceback
            for name in f.keys():
                match = _LAYER.match(name)
                groups.setdefault(match.group(1) if match else "", []).append((file, name))
    return groups


def write_quantized(src: Path, out: Path, method, calibration, ignore: list[str], extra: dict,
                    device: torch.device = torch.device("cpu")) -> dict:
    from nanocore.loader.safetensors_io import open_safetensors

    groups, shards, pending, pending_bytes, ignored, config = layer_groups(src), [], {}, 0, set(), {}
    for group in tqdm(sorted(groups, key=_layer_order), desc=f"quantize {method.name}", unit="layer"):
        tensors = {}
        for file in dict.fromkeys(file for file, _ in groups[group]):  # each file of this layer opened once
            with open_safetensors(file) as f:
                tensors.update((name, f.get_tensor(name)) for fname, name in groups[group] if fname == file)
        keep = {n: t for n, t in tensors.items() if n.endswith(".weight") and is_ignored(n[:-7], ignore)}
        ignored.update(n[:-7] for n in keep if n[:-7] in quantizable_linears(keep))
        todo = {n: t.to(device) for n, t in tensors.items() if n not in keep}  # one layer on the device at a time
        layer_calibration = _calibration_of(group, calibration, device)
        if calibration and not layer_calibration and quantizable_linears(todo):  # never a silent uncalibrated layer
            raise ValueError(f"calibration activations were given but none for the linears of {group or 'the model'!r} "
                             f"(have e.g. {sorted(calibration)[:3]}); the calibration model's module names must "
                             f"match the checkpoint's tensor names")
        quantized, config = method.quantize(todo, layer_calibration, **extra)
        for name, tensor in {**quantized, **keep}.items():
            pending[name] = tensor.contiguous().cpu()
            pending_bytes += tensor.numel() * tensor.element_size()
        if pending_bytes > _SHARD_BYTES:
            shards.append(pending)
            pending, pending_bytes = {}, 0
    shards.append(pending)
    save_shards(out, shards)
    key = next((k for k in IGNORE_KEYS if k in config), None)
    if key is not None:
        config[key] = sorted(set(config[key]) | ignored | ({"lm_head"} if key == "ignore" else set()))
    return config


def _calibration_of(group: str, calibration: dict | None, device: torch.device) -> dict | None:
    """The calibration inputs of one layer group's linears (group '': those outside the decoder layers), on
    ``device`` (the search runs there; the whole model's inputs stay on the CPU)."""
    if calibration is None:
        return None
    mine = {name: x for name, x in calibration.items()
            if (name.startswith(group + ".") if group else not _LAYER.match(name + "."))}
    return {name: x.to(device) for name, x in mine.items()}


def save_shards(out: Path, shards: list[dict[str, torch.Tensor]]) -> None:
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        weight_map.update({tensor: name for tensor in shard})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))


def _layer_order(group: str) -> tuple[int, str]:
    match = re.search(r"\.layers\.(\d+)$", group)
    return (int(match.group(1)) if match else -1, group)


def collect_calibration(src: Path, text_file: Path, samples: int, seqlen: int,
                        device: torch.device = torch.device("cpu"), max_rows: int = 2048):
    """Inputs of every nn.Linear of the float model (Hugging Face transformers) on the calibration text, run on
    ``device``; kept on the CPU (each layer's are moved to its weight's device when it is quantized)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not text_file.is_file():
        raise FileNotFoundError(f"calibration text {text_file} does not exist")
    ids = AutoTokenizer.from_pretrained(src)(text_file.read_text(), return_tensors="pt").input_ids[0]
    if ids.numel() < seqlen + 1:
        raise ValueError(f"{text_file} has {ids.numel()} tokens, fewer than --calib-seqlen {seqlen}")
    starts = torch.randint(0, ids.numel() - seqlen, (samples,), generator=torch.Generator().manual_seed(0))
    batch = torch.stack([ids[s:s + seqlen] for s in starts.tolist()])
    model = AutoModelForCausalLM.from_pretrained(src, torch_dtype=torch.float32).eval().to(device)
    inputs: dict[str, list[torch.Tensor]] = {}
    hooks = [module.register_forward_pre_hook(lambda m, a, name=name: inputs.setdefault(name, []).append(
        a[0].detach().reshape(-1, a[0].shape[-1]).cpu())) for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)]
    with torch.no_grad():
        for row in tqdm(batch, desc="calibration", unit="seq"):
            model(row[None].to(device))
    for hook in hooks:
        hook.remove()
    rows = torch.Generator().manual_seed(1)
    out = {}
    for name, parts in inputs.items():
        x = torch.cat(parts)
        out[name] = x[torch.randperm(x.shape[0], generator=rows)[:max_rows]] if x.shape[0] > max_rows else x
    return out

"""One decoder layer's linears built the way the engine builds them: the core's parallel layers (merged q/k/v
and gate/up, tensor-parallel shards of a simulated rank) loaded from checkpoint tensors named as in a real
checkpoint, each through its parameter's ``weight_loader`` with the merged shard id the model loader passes."""
from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from nanocore.distributed import ParallelContext
from nanocore.layers.linear import LinearBase, MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from nanocore.models.decoder import DecoderForCausalLM

PREFIX = "model.layers.0."
#: checkpoint module (after PREFIX) -> module of the layer set; merged ones map through the model's stacked_params
MODULES = {"self_attn.q_proj": "qkv_proj", "self_attn.k_proj": "qkv_proj", "self_attn.v_proj": "qkv_proj",
           "self_attn.o_proj": "o_proj", "mlp.gate_proj": "gate_up_proj", "mlp.up_proj": "gate_up_proj",
           "mlp.down_proj": "down_proj"}
SHARD_IDS = {original: shard_id for _, original, shard_id in DecoderForCausalLM.stacked_params}
ROW_PARALLEL = ("o_proj", "down_proj")


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    head_dim: int
    num_heads: int
    num_kv_heads: int
    intermediate: int
    qkv_bias: bool


def checkpoint_weights(shape: LayerShape, g: torch.Generator) -> dict[str, torch.Tensor]:
    """A decoder layer's float tensors as a Hugging Face checkpoint names them (norms included, left alone)."""
    s = shape
    q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    sizes = {"self_attn.q_proj": (q, s.hidden), "self_attn.k_proj": (kv, s.hidden), "self_attn.v_proj": (kv, s.hidden),
             "self_attn.o_proj": (s.hidden, q), "mlp.gate_proj": (s.intermediate, s.hidden),
             "mlp.up_proj": (s.intermediate, s.hidden), "mlp.down_proj": (s.hidden, s.intermediate)}
    out = {f"{PREFIX}{name}.weight": realistic_weight(*size, g) for name, size in sizes.items()}
    out[PREFIX + "input_layernorm.weight"] = torch.rand(s.hidden, generator=g) + 0.5
    out[PREFIX + "post_attention_layernorm.weight"] = torch.rand(s.hidden, generator=g) + 0.5
    if s.qkv_bias:
        for name in ("q_proj", "k_proj", "v_proj"):
            out[f"{PREFIX}self_attn.{name}.bias"] = torch.randn(sizes[f"self_attn.{name}"][0], generator=g)
    return out


def realistic_weight(rows: int, cols: int, g: torch.Generator, block: int = 32) -> torch.Tensor:
    """Gaussian weights whose rows and 32-column blocks differ in magnitude (up to ~20x) and whose blocks are
    off-centre, as in trained layers: a per-tensor scale or a symmetric grid for an asymmetric format shows."""
    blocks = -(-cols // block)
    row_scale = torch.exp(torch.empty(rows, 1).uniform_(-1.5, 1.5, generator=g))
    block_scale = torch.exp(torch.empty(1, blocks).uniform_(-1.0, 1.0, generator=g))
    block_offset = 0.7 * torch.randn(rows, blocks, generator=g)
    expand = lambda t: t.repeat_interleave(block, dim=1)[:, :cols]
    w = (torch.randn(rows, cols, generator=g) + expand(block_offset)) * row_scale * expand(block_scale)
    return w * cols ** -0.5


def random_activations(*shape: int, g: torch.Generator) -> torch.Tensor:
    """Tokens of different norms with some loud channels, as hidden states are (per-token scales matter)."""
    channel = torch.exp(torch.empty(shape[-1]).uniform_(-1.0, 1.0, generator=g))
    token = torch.exp(torch.empty(*shape[:-1], 1).uniform_(-1.0, 1.0, generator=g))
    return torch.randn(*shape, generator=g) * channel * token


def build_layers(method_factory, shape: LayerShape, tp_rank: int, tp_size: int, dtype, device) -> dict[str, LinearBase]:
    """qkv_proj, o_proj, gate_up_proj, down_proj of rank ``tp_rank``; one method instance per layer."""
    parallel = ParallelContext(tp_rank=tp_rank, tp_size=tp_size)
    s, common = shape, {"parallel": parallel, "params_dtype": dtype}
    with torch.device(device):
        return {
            "qkv_proj": QKVParallelLinear(s.hidden, s.head_dim, s.num_heads, s.num_kv_heads, bias=s.qkv_bias,
                                          linear_method=method_factory(), prefix="qkv_proj", **common),
            "o_proj": RowParallelLinear(s.num_heads * s.head_dim, s.hidden, linear_method=method_factory(),
                                        prefix="o_proj", **common),
            "gate_up_proj": MergedColumnParallelLinear(s.hidden, [s.intermediate] * 2, linear_method=method_factory(),
                                                       prefix="gate_up_proj", **common),
            "down_proj": RowParallelLinear(s.intermediate, s.hidden, linear_method=method_factory(),
                                           prefix="down_proj", **common),
        }


def split_name(checkpoint_name: str) -> tuple[str, str, tuple] | None:
    """(layer, parameter, loader args) for a checkpoint tensor of one of the linears; None for the rest."""
    for module, layer in MODULES.items():
        head = PREFIX + module + "."
        if checkpoint_name.startswith(head):
            original = module.rpartition(".")[2]
            return layer, checkpoint_name[len(head):], ((SHARD_IDS[original],) if original in SHARD_IDS else ())
    return None


def load_checkpoint(layers: dict[str, LinearBase], tensors: dict[str, torch.Tensor], device, who: str) -> None:
    """Load every linear's tensors as the model loader does, then ``process_weights_after_loading``."""
    loaded: dict[str, set] = {name: set() for name in layers}
    for name, tensor in tensors.items():
        where = split_name(name)
        if where is None:
            continue
        layer_name, param_name, loader_args = where
        param = getattr(layers[layer_name], param_name, None)
        assert isinstance(param, torch.Tensor), (
            f"{who}: checkpoint tensor {name!r} (from quantize) has no parameter {param_name!r} on {layer_name}; "
            f"create_weights must register a parameter for every tensor quantize writes")
        loader = getattr(param, "weight_loader", None)
        assert loader is not None, (
            f"{who}: parameter {param_name!r} has no weight_loader; attach it with set_weight_attrs")
        loader(param, tensor.to(device), *loader_args)
        loaded[layer_name].add((param_name, loader_args))
    for layer_name, layer in layers.items():
        wanted = {(p, (s,) if len(layer.shard_ids) > 1 else ()) for p, t in layer.named_parameters()
                  if hasattr(t, "weight_loader") for s in layer.shard_ids}
        missing = sorted(str(w) for w in wanted - loaded[layer_name])
        assert not missing, (
            f"{who}: {layer_name} parameters with a weight_loader got no checkpoint tensor: {missing}; quantize must "
            f"write every tensor create_weights registers (per q/k/v, gate/up shard)")
        layer.linear_method.process_weights_after_loading(layer)


def check_quantize_output(cls: type, weights: dict[str, torch.Tensor], tensors: dict, config: dict) -> None:
    """The offline contract: other tensors pass through, every linear is written, the config is JSON."""
    assert isinstance(tensors, dict) and isinstance(config, dict), (
        f"{cls.__name__}.quantize must return (dict of tensors, quantization_config dict)")
    for name in weights:
        if split_name(name) is None:
            assert name in tensors, f"quantize dropped {name!r}; return the tensors it does not quantize as given"
    for module in MODULES:
        written = [n for n in tensors if n.startswith(PREFIX + module + ".")]
        assert written, f"quantize returned no tensor for {PREFIX + module}; it received {PREFIX + module}.weight"
    try:
        json.dumps(config)
    except (TypeError, ValueError) as exc:
        raise AssertionError(f"quantize's quantization_config is not JSON-serializable ({exc}); it goes into "
                             f"config.json") from None
    if config:
        reason = cls.checkpoint_support(config)
        assert reason is None, (f"quantize wrote {config} but the class's checkpoint_support refuses it ({reason}); "
                                f"'auto' would not pick it for its own checkpoints")


def quantize_layer(cls: type, weights: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict]:
    """What ``nanocore quantize`` writes for one decoder layer: ``quantize`` output, else the tensors themselves."""
    try:
        tensors, config = cls.quantize(dict(weights))
    except NotImplementedError:
        return dict(weights), {}
    check_quantize_output(cls, weights, tensors, config)
    return tensors, config


def method_options(options: dict, config: dict) -> dict:
    """The options the model loader gives a method for a checkpoint with this ``quantization_config``."""
    options = dict(options)
    if config.get("quant_method") is not None:
        options.setdefault("quantization_config", config)
    return options

"""LinearMethod: how a linear layer stores its weights and computes ``y = x W^T + b``.

The seams are vLLM's: ``create_weights`` registers parameters on the layer, ``process_weights_after_loading``
repacks them, ``apply`` runs the GEMM. The whole life of one instance:

1. ``__init__(options)``: one instance per linear layer. ``options`` is the user's ``linear_method_options``
   plus, when the checkpoint is quantized, ``options["quantization_config"]``: the checkpoint's dict, added by
   the core (``check_options`` always accepts it). Layers in the checkpoint's ignore list get ``unquantized``.
2. ``create_weights(layer, ...)`` registers this tensor-parallel rank's partition as ``layer.<name>``
   parameters, one per checkpoint tensor name (``weight``, ``weight_scale``, ``qweight``, ...), each with
   ``set_weight_attrs(param, {"weight_loader": weight_loader, ...})`` and the attributes the layer's loader
   reads: ``output_dim`` (the dimension along output features: TP shards and merged shards are placed along
   it), ``input_dim`` (narrowed on row-parallel layers), ``packed_dim`` + ``packed_factor`` (several logical
   values per stored element, e.g. 8 int4 in an int32: offsets along that dim are divided by the factor).
   A parameter with neither dim attribute (a per-tensor scale) is copied whole, or, when it has one element
   per merged shard, into the slot of the shard being loaded.
3. The loader calls ``weight_loader(param, checkpoint_tensor, shard_id)`` once per checkpoint tensor:
   ``shard_id`` is None for a plain layer, ``"q"`` / ``"k"`` / ``"v"`` for qkv_proj, ``0`` / ``1`` for
   gate_up_proj (``output_partition_sizes`` lists the shards in that order). Checkpoint tensors are the full,
   unsharded ones; the layer narrows them for its rank.
4. ``process_weights_after_loading(layer)`` once, after every tensor of every layer loaded: repack, transpose,
   quantize on the fly, check that everything arrived (``nanocore.toolkit.checkpoint.check_all_loaded``).
5. ``apply(layer, x, bias)`` on every forward: hot path. It must be CUDA-graph safe (no host
   synchronisation, no allocation whose size depends on data, no Python branching on tensor values) since
   decode steps are captured, and it must accept any leading shape ``[..., input_size_per_partition]``.

Offline side (``nanocore quantize --method NAME``): the classmethod ``quantize(weights, calibration, **kw)`` is
called once per decoder layer (and once for the tensors outside the layers) with that group's float tensors by
checkpoint name (``model.layers.0.self_attn.q_proj.weight``, biases and norms included; layers the user
``--ignore``s are left out). It quantizes the tensors ``nanocore.toolkit.checkpoint.quantizable_linears``
selects (never embeddings, lm_head, norms or routers) and returns ``(tensors, quantization_config)``: every
tensor it got, the quantized ones replaced by the method's checkpoint tensors under the same prefix
(``...q_proj.weight`` + ``...q_proj.weight_scale``), and a JSON-serializable config in one of the ecosystem's
formats (compressed-tensors, fp8, AutoAWQ). ``calibration`` maps a linear's prefix
(``model.layers.0.self_attn.q_proj``) to sample inputs ``[tokens, in_features]`` when the user gives
``--calib-text``, else it is None. Keyword options are passed only when the user gives them: ``group_size``
(``--group-size``) and ``fp8_scale`` (``--fp8-scale``); declare the ones you take as keyword parameters (the CLI
refuses an option the signature lacks). The returned tensors must load back through ``create_weights`` +
``weight_loader`` with this method.

``conformance_requirements`` a method may declare (a class attribute dict, applied by every conformance class):
``{"input_size_multiple": 128, "output_size_multiple": 8}``, the multiples of K and of each output partition its
layout needs (group size, packing; default 1), and ``"m_thresholds": (16, 128)``, the row counts M at which ``apply``
switches kernels (GEMV, split-K, tiles; each side of each is tested; since 1.5). A method whose ``quant_scheme()``
declares rounded activations rounds them as declared, at least for prefill-sized batches (64 rows; since 1.6); one that
computes them more accurately declares ``"rounds_declared_activations": False`` (its scheme then only bounds the
error).
"""
from __future__ import annotations

from abc import abstractmethod
from typing import Any, Callable, ClassVar

import torch

from nanocore.interfaces.base import Backend
from nanocore.interfaces.quant_scheme import QuantScheme

WeightLoader = Callable[..., None]


def set_weight_attrs(param: torch.Tensor, attrs: dict[str, Any]) -> None:
    """Attach loading metadata (``weight_loader``, ``output_dim``, ...) to a parameter."""
    for key, value in attrs.items():
        assert not hasattr(param, key), f"parameter already has attribute {key}"
        setattr(param, key, value)


class LinearMethod(Backend):
    #: Deprecated for linear methods (kept for 1.0 plugins): the conformance suite derives the tolerance of
    #: ``apply`` from ``quant_scheme()``, the rounding the format allows. A 1.0 method that sets this but does not
    #: implement ``quant_scheme()`` is held to 1.0's rule with it (atol relative to max |x| |W|^T), and warned.
    tolerance: ClassVar[tuple[float, float]] = (1e-5, 1e-5)
    #: Checkpoint ``quantization_config`` this method loads; ``None`` for plain checkpoints. Kept for 1.0 plugins:
    #: the default ``checkpoint_support`` compares it; a method that loads by scheme overrides that instead.
    quant_method: ClassVar[str | None] = None
    #: Among installed methods that load a checkpoint (``checkpoint_support``), ``auto`` picks the highest.
    checkpoint_priority: ClassVar[int] = 0

    @classmethod
    def checkpoint_priority_for(cls, quantization_config: dict | None) -> int:
        """``auto``'s preference for a checkpoint with this ``quantization_config`` (one format can hold
        several schemes, e.g. weight-only or not); the default is ``checkpoint_priority``."""
        return cls.checkpoint_priority

    @classmethod
    def checkpoint_support(cls, quantization_config: dict | None) -> str | None:
        """None if this method loads a checkpoint with this ``quantization_config`` (None: a plain checkpoint),
        else the reason it cannot. The loader routes by it: ``auto`` picks among the methods that return None
        (highest ``checkpoint_priority_for``), and an explicit name that returns a reason fails with it, naming
        the installed methods that can. Build it on ``nanocore.toolkit.checkpoint_formats``, which parses
        compressed-tensors / fp8 / AutoAWQ / GPTQ configs into ``QuantScheme``s. The default keeps the 1.0 rule:
        a checkpoint whose ``quant_method`` is this class's ``quant_method``."""
        quant = (quantization_config or {}).get("quant_method")
        if quant == cls.quant_method:
            return None
        if cls.quant_method is None:
            return f"{cls.__name__} loads 'unquantized' checkpoints, not quant_method {quant!r}"
        return f"{cls.__name__} loads quant_method {cls.quant_method!r} checkpoints, not {quant or 'unquantized'!r}"

    @abstractmethod
    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        weight_loader: WeightLoader,
    ) -> None:
        """Register this layer's parameters (this TP rank's partition) on ``layer``, each carrying
        ``weight_loader`` and its dim attributes (module docstring, step 2). ``output_partition_sizes``: rows of
        each merged shard on this rank; ``input_size`` / ``output_size``: the full, unsharded layer."""

    def quant_scheme(self) -> QuantScheme | None:
        """How this instance (with its options) rounds weights and activations; ``None``: it does not quantize.
        The conformance suite derives the tolerance of ``apply`` from it and checks that declared activation
        rounding happens (module docstring), so declare what you really compute."""
        return None

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Repack loaded weights for ``apply`` (transpose, quantize, ...). Default: nothing."""

    @abstractmethod
    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """Return ``x @ W^T (+ bias)`` in ``x.dtype``, ``x`` of shape ``[..., input_size_per_partition]``; an ``x``
        of another last dimension is a ValueError naming both sizes. CUDA-graph safe (module docstring, step 5)."""

    @classmethod
    def quantize(
        cls, weights: dict[str, torch.Tensor], calibration: dict[str, torch.Tensor] | None = None
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Offline side of ``nanocore quantize`` (module docstring): a decoder layer's tensors by checkpoint
        name -> (every tensor, the quantizable linears replaced by this method's, ``quantization_config``)."""
        raise NotImplementedError(f"linear method {cls.name!r} does not implement offline quantization")

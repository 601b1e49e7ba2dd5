"""The mixture-of-experts layer: router -> prepare/finalize -> the configured ``MoEExecutor``.

Seams follow vLLM's modular fused MoE. The router picks ``top_k`` experts per token (softmax, then
optional renormalisation). Prepare/finalize moves tokens to the experts' owners and the results back:
``LocalPrepareFinalize`` when one rank holds every expert, ``AllToAllPrepareFinalize`` for expert
parallelism. A shared expert (Qwen2-MoE) may run beside the routed experts on a side CUDA stream
(``StreamOverlap``). The executor only ever sees this rank's stacked weights ``w13[E_local, 2I, H]`` (gate
rows then up rows) and ``w2[E_local, H, I]``, loaded from per-expert checkpoint tensors (``moe_weights.py``): in the
model dtype, or fp8 with per-row scales (``weight_format="fp8_channel"``) for an executor that declares that format.
"""
from __future__ import annotations

import re
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from nanocore.distributed import ParallelContext, divide, tp_all_reduce
from nanocore.interfaces import MoEExecutor, set_weight_attrs
from nanocore.layers.moe_weights import ExpertWeights

#: ``experts(x, topk_weights, topk_ids) -> [M, H]`` over this rank's experts (local expert ids).
ExpertsFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

_EXPERT_WEIGHT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)"
                            r"\.(?P<tensor>weight|weight_scale)$")
_SHARD_OF_PROJ = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}

#: Default of the engine option ``moe_shared_expert_overlap``: shared expert on a side CUDA stream.
SHARED_EXPERT_OVERLAP = True


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts, keep the ``top_k`` largest: ``(weights[M,K] float32, ids[M,K] int64)``."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    topk_weights, topk_ids = probs.topk(top_k, dim=-1)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids


def match_expert_weight(name: str) -> tuple[str, int, str] | None:
    """``...experts.N.gate_proj.weight`` -> (``...experts.w13``, N, ``"w1"``), ``...weight_scale`` ->
    ``...experts.w13_scale`` (fp8 experts); None for other names."""
    m = _EXPERT_WEIGHT.match(name)
    if m is None:
        return None
    shard_id = _SHARD_OF_PROJ[m["proj"]]
    param = ("w2" if shard_id == "w2" else "w13") + ("_scale" if m["tensor"] == "weight_scale" else "")
    return f"{m['prefix']}.{param}", int(m["expert"]), shard_id


class Router(nn.Module):
    """The gate: ``router_logits = x @ weight^T``, replicated on every rank (it is tiny)."""

    def __init__(self, hidden_size: int, num_experts: int, params_dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, dtype=params_dtype), requires_grad=False)
        set_weight_attrs(self.weight, {"weight_loader": _load_whole})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class LocalPrepareFinalize:
    """Every expert lives on this rank: run the executor on the tokens as they are."""

    cuda_graph_blocker = None

    def __call__(self, x, topk_weights, topk_ids, experts: ExpertsFn) -> torch.Tensor:
        return experts(x, topk_weights, topk_ids)


class AllToAllPrepareFinalize:
    """Expert parallelism: each (token, owner rank) pair travels once, results come back and are summed.

    Rank ``r`` owns experts ``[r * E_local, (r + 1) * E_local)``. A token is sent to a rank with all
    ``top_k`` ids, those owned elsewhere set to -1 (the executor contract: they contribute nothing).
    Message sizes depend on routing, so this path synchronises with the host (no CUDA graphs).
    """

    cuda_graph_blocker = "expert parallelism sizes its all-to-all messages on the host"

    def __init__(self, group, ep_size: int, num_local_experts: int):
        self.group, self.ep_size, self.num_local_experts = group, ep_size, num_local_experts

    def __call__(self, x, topk_weights, topk_ids, experts: ExpertsFn) -> torch.Tensor:
        owner = topk_ids // self.num_local_experts  # [M, K]
        ranks = torch.arange(self.ep_size, device=x.device)
        owned = owner.unsqueeze(0) == ranks[:, None, None]  # [ep, M, K]
        dest, token = owned.any(dim=-1).nonzero(as_tuple=True)  # rank-major: ready to send
        local_ids = torch.where(owned[dest, token], topk_ids[token] - dest[:, None] * self.num_local_experts, -1)
        send_counts = torch.bincount(dest, minlength=self.ep_size)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send, recv = send_counts.tolist(), recv_counts.tolist()
        x_recv = self._exchange(x[token], send, recv)
        weights_recv = self._exchange(topk_weights[token].float(), send, recv)
        ids_recv = self._exchange(local_ids, send, recv)
        y_recv = experts(x_recv, weights_recv, ids_recv)
        y_back = self._exchange(y_recv, recv, send)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        out.index_add_(0, token, y_back.float())
        return out.to(x.dtype)

    def _exchange(self, tensor: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        out = tensor.new_empty((sum(recv), *tensor.shape[1:]))
        dist.all_to_all_single(out, tensor.contiguous(), recv, send, group=self.group)
        return out


class StreamOverlap:
    """``run(device, main_fn, side_fn) -> (main_fn(), side_fn())``, the two concurrently on CUDA.

    Fork: a side stream waits on an event recorded on the current stream, then ``side_fn`` is launched
    on it before ``main_fn`` (so the GPU starts it while the host still launches the main branch). Join:
    the current stream waits on the side stream before returning. Both are legal inside CUDA-graph
    capture, where they become two parallel branches of the graph. One side stream per device, taken
    once and kept. Disabled, or on CPU, the branches run one after the other: same kernels, same numbers.
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._side_streams: dict[torch.device, torch.cuda.Stream] = {}

    def active(self, device: torch.device) -> bool:
        return self.enabled and device.type == "cuda"

    def run(self, device: torch.device, main_fn: Callable[[], torch.Tensor],
            side_fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.active(device):
            return main_fn(), side_fn()
        main, side = torch.cuda.current_stream(device), self.side_stream(device)
        side.wait_stream(main)  # fork: the side branch's inputs are complete
        with torch.cuda.stream(side):
            side_out = side_fn()
        main_out = main_fn()
        main.wait_stream(side)  # join: the caller may combine the two
        # side_out is freed after main's reads: without this the allocator could hand it to the side stream
        # too early. Inputs need nothing: the caller holds them past the join, and main's later reuse follows it.
        side_out.record_stream(main)
        return main_out, side_out

    def side_stream(self, device: torch.device) -> torch.cuda.Stream:
        if device not in self._side_streams:
            self._side_streams[device] = torch.cuda.Stream(device)
        return self._side_streams[device]


class FusedMoE(nn.Module):
    """Routed experts of one MoE block: ``forward(x[M,H], router_logits[M,E]) -> [M,H]``.

    Expert parallel (``ep_size > 1``): this rank holds ``E / ep_size`` whole experts. Otherwise, with
    tensor parallelism, every expert's intermediate dimension is split over the TP ranks and the
    partial outputs are summed (``reduce_results``). ``weight_format="fp8_channel"`` holds the experts in fp8 with
    per-row scales (``w13_scale``, ``w2_scale``) and passes the scales to the executor, which must take that format.
    """

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int, *,
                 executor: MoEExecutor, parallel: ParallelContext | None = None, renormalize: bool = False,
                 params_dtype: torch.dtype = torch.float32, activation: str = "silu", reduce_results: bool = True,
                 weight_format: str = "float"):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok ({top_k}) must be between 1 and num_experts ({num_experts})")
        parallel = parallel or ParallelContext()
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.executor, self.activation, self.parallel = executor, activation, parallel
        self.num_local_experts = divide(num_experts, parallel.ep_size, "num_experts")
        self.expert_start = parallel.ep_rank * self.num_local_experts
        self.tp_shards = parallel.tp_size if parallel.ep_size == 1 else 1
        self.intermediate_per_rank = divide(intermediate_size, self.tp_shards, "moe_intermediate_size")
        self.reduce_results = reduce_results and self.tp_shards > 1
        declared = getattr(executor, "weight_formats", ("float",))
        if weight_format != "float" and weight_format not in declared:
            raise ValueError(f"MoE executor {type(executor).__name__} does not take {weight_format!r} expert weights "
                             f"(it declares {list(declared)}); load the experts in float")
        self.weight_format = weight_format
        self.expert_weights = ExpertWeights(self, self.num_local_experts, hidden_size, params_dtype, weight_format)
        if parallel.ep_size > 1:
            self.prepare_finalize = AllToAllPrepareFinalize(parallel.ep_group, parallel.ep_size, self.num_local_experts)
        else:
            self.prepare_finalize = LocalPrepareFinalize()

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        topk_weights, topk_ids = select_experts(router_logits, self.top_k, self.renormalize)
        out = self.prepare_finalize(x, topk_weights, topk_ids, self._run_experts)
        return tp_all_reduce(out, self.parallel) if self.reduce_results else out

    def _run_experts(self, x, topk_weights, topk_ids) -> torch.Tensor:
        return self.executor.apply(x, topk_weights, topk_ids, self.w13, self.w2, self.activation,
                                   **self.expert_weights.executor_kwargs())

    def extra_repr(self) -> str:
        return (f"experts={self.num_local_experts}/{self.num_experts}, top_k={self.top_k}, "
                f"intermediate={self.intermediate_per_rank}, weights={self.weight_format}, "
                f"executor={type(self.executor).__name__}")


def _load_whole(param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
    if param.shape != loaded_weight.shape:
        raise ValueError(f"router weight has shape {tuple(loaded_weight.shape)}, expected {tuple(param.shape)}")
    param.data.copy_(loaded_weight)

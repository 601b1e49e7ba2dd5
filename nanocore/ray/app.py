"""The Ray Serve application: engine replicas (one engine each) behind one OpenAI ingress, and their resources."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig

from nanocore.config import EngineConfig
from nanocore.serve.server import SHUTDOWN_BACKSTOP_S
from nanocore.ray.ingress import OpenAIIngress
from nanocore.ray.replica import EngineReplica
from nanocore.ray.routing import DEFAULT_AFFINITY_TOKENS, DEFAULT_LOAD_SLACK, PrefixAffinityRouter

APP_NAME = "nanocore"
ENGINE_DEPLOYMENT = "EngineReplica"
INGRESS_DEPLOYMENT = "OpenAIIngress"


@dataclass
class ReplicaOptions:
    """How many engine replicas, what each asks of the cluster, and how requests are spread over them."""

    num_replicas: int = 1
    min_replicas: int | None = None  # with max_replicas: autoscale on ongoing requests instead of a fixed count
    max_replicas: int | None = None
    target_ongoing_requests: float = 2.0  # per replica, what the autoscaler aims for
    num_cpus: float = 1.0  # per replica; fractional values pack several replicas onto a core (CPU tests)
    num_gpus: float | None = None  # per replica; None: one per rank on a GPU, none on the CPU
    max_ongoing_requests: int | None = None  # per replica; None: the engine's max_num_seqs
    health_check_period_s: float = 10.0
    health_check_timeout_s: float = 30.0
    affinity_tokens: int = DEFAULT_AFFINITY_TOKENS
    load_slack: int = DEFAULT_LOAD_SLACK
    ingress_num_cpus: float = 1.0

    def check(self) -> None:
        problems = []
        if self.num_replicas < 1:
            problems.append(f"--num-replicas must be >= 1, got {self.num_replicas}")
        if (self.min_replicas is None) != (self.max_replicas is None):
            problems.append("autoscaling needs both --min-replicas and --max-replicas")
        elif self.max_replicas is not None and not 0 <= self.min_replicas <= self.max_replicas >= 1:
            problems.append(f"need 0 <= --min-replicas <= --max-replicas and --max-replicas >= 1, got "
                            f"{self.min_replicas} and {self.max_replicas}")
        for name in ("num_cpus", "ingress_num_cpus", "target_ongoing_requests", "health_check_period_s",
                     "health_check_timeout_s"):
            if not getattr(self, name) > 0:
                problems.append(f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name)}")
        if self.num_gpus is not None and self.num_gpus < 0:
            problems.append(f"--num-gpus must be >= 0, got {self.num_gpus}")
        if self.affinity_tokens < 1 or self.load_slack < 0:
            problems.append(f"--affinity-tokens must be >= 1 and --load-slack >= 0, got {self.affinity_tokens} "
                            f"and {self.load_slack}")
        if problems:
            raise ValueError("; ".join(problems))


def replica_resources(config: EngineConfig, options: ReplicaOptions, cluster_has_gpus: bool) -> dict[str, Any]:
    """``ray_actor_options`` of one replica and, for a multi-GPU (TP / EP / PP) replica, its placement group: all of
    its GPUs in one bundle on one node, since the engine's ranks are its own child processes (they see the GPUs Ray
    gave the replica, and only those)."""
    if config.device.startswith("cuda:"):
        raise ValueError(f"--device {config.device} names one GPU of this machine, but each Ray replica sees only "
                         f"the GPUs Ray gave it: use --device cuda (or auto)")
    ranks = max(config.tensor_parallel_size, config.expert_parallel_size) * config.pipeline_parallel_size
    on_gpu = config.device == "cuda" or (config.device == "auto" and cluster_has_gpus)
    num_gpus = options.num_gpus if options.num_gpus is not None else (ranks if on_gpu else 0)
    if on_gpu and num_gpus < ranks:
        raise ValueError(f"a replica of {ranks} ranks (tensor / expert / pipeline parallel) needs {ranks} GPUs, but "
                         f"--num-gpus is {num_gpus}: leave it out or give {ranks}")
    resources: dict[str, Any] = {"ray_actor_options": {"num_cpus": options.num_cpus, "num_gpus": num_gpus}}
    if on_gpu and ranks > 1:
        resources["placement_group_bundles"] = [{"CPU": options.num_cpus, "GPU": num_gpus}]
        resources["placement_group_strategy"] = "STRICT_PACK"
    return resources


def replica_count(options: ReplicaOptions) -> dict[str, Any]:
    if options.max_replicas is None:
        return {"num_replicas": options.num_replicas}
    return {"autoscaling_config": {"min_replicas": options.min_replicas, "max_replicas": options.max_replicas,
                                   "initial_replicas": max(options.min_replicas, 1),
                                   "target_ongoing_requests": options.target_ongoing_requests}}


def build_application(config: EngineConfig, options: ReplicaOptions, server: dict[str, Any],
                      cluster_has_gpus: bool = False):
    """The application to ``serve.run``. ``server``: the HTTP options of ``nanocore serve`` (served_model_name,
    api_key, max_waiting_requests, drain_timeout_s, max_body_mib, stream_interval; optional chat_template text and
    tool_call_parser)."""
    options.check()
    health = {"health_check_period_s": options.health_check_period_s,
              "health_check_timeout_s": options.health_check_timeout_s}
    router = RequestRouterConfig(request_router_class=PrefixAffinityRouter,
                                 request_router_kwargs={"load_slack": options.load_slack})
    per_replica = options.max_ongoing_requests or config.max_num_seqs
    engine = serve.deployment(EngineReplica, name=ENGINE_DEPLOYMENT).options(
        **replica_count(options), **replica_resources(config, options, cluster_has_gpus), **health,
        max_ongoing_requests=per_replica, request_router_config=router)
    # the ingress holds every request, waiting or running: admission (429) is its engine client's, never Ray's
    running = per_replica * (options.max_replicas or options.num_replicas)
    ingress = serve.deployment(OpenAIIngress, name=INGRESS_DEPLOYMENT).options(
        num_replicas=1, ray_actor_options={"num_cpus": options.ingress_num_cpus}, **health,
        max_ongoing_requests=server["max_waiting_requests"] + running,
        graceful_shutdown_timeout_s=server["drain_timeout_s"] + SHUTDOWN_BACKSTOP_S)
    ingress_server = {**server, "affinity_tokens": options.affinity_tokens}
    return ingress.bind(engine.bind(config.model_dump(), server["stream_interval"]), ingress_server)

"""``nanocore serve-ray``: data parallel on Ray Serve: N engine replicas (one engine each) behind the OpenAI routes
of ``nanocore serve``, requests spread by load with prefix-cache affinity.

The engine flags are those of ``nanocore serve`` (the same EngineConfig, backends by name); every replica builds
the same engine. Without ``--ray-address`` (or RAY_ADDRESS) a local Ray cluster is started. Needs the ray extra:
``pip install 'nanocore-llm[ray]'``.
"""
from __future__ import annotations

import logging
import os
import signal
import time

from nanocore.cli.common import add_engine_args, engine_config_from_args
from nanocore.cli.serve_cmd import API_KEY_ENV, add_server_args, check_server_args
from nanocore.serve.prompts import load_chat_template

RAY_MISSING = "nanocore serve-ray needs Ray Serve, which is not installed ({error}): pip install 'nanocore-llm[ray]'"


def register(subparsers) -> None:
    p = subparsers.add_parser("serve-ray", help="OpenAI-compatible server over N engine replicas on Ray Serve",
                              description=__doc__)
    add_server_args(p)
    r = p.add_argument_group("Ray Serve replicas")
    r.add_argument("--ray-address", default=None, help="Ray cluster to join (default: RAY_ADDRESS, else a local one)")
    r.add_argument("--num-replicas", type=int, default=1, help="engine replicas (default 1)")
    r.add_argument("--min-replicas", type=int, default=None, help="autoscale between this and --max-replicas")
    r.add_argument("--max-replicas", type=int, default=None, help="autoscale between --min-replicas and this")
    r.add_argument("--target-ongoing-requests", type=float, default=2.0,
                   help="requests per replica the autoscaler aims for (default 2)")
    r.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per replica, may be fractional (default 1)")
    r.add_argument("--num-gpus", type=float, default=None,
                   help="GPUs per replica (default: its ranks, max(TP, EP) x PP, on a GPU; 0 on the CPU)")
    r.add_argument("--max-ongoing-requests", type=int, default=None,
                   help="requests a replica takes at once (default: --max-num-seqs)")
    r.add_argument("--health-check-period", type=float, default=10.0, help="seconds between health checks")
    r.add_argument("--health-check-timeout", type=float, default=30.0, help="seconds a health check may take")
    r.add_argument("--affinity-tokens", type=int, default=None,
                   help="leading prompt tokens that pick a request's preferred replica (default 128)")
    r.add_argument("--load-slack", type=int, default=None,
                   help="requests the preferred replica may queue beyond the least loaded one (default 4)")
    add_engine_args(p)
    p.set_defaults(func=run)


def replica_options(args):
    from nanocore.ray.app import ReplicaOptions

    chosen = {"affinity_tokens": args.affinity_tokens, "load_slack": args.load_slack}
    return ReplicaOptions(num_replicas=args.num_replicas, min_replicas=args.min_replicas,
                          max_replicas=args.max_replicas, target_ongoing_requests=args.target_ongoing_requests,
                          num_cpus=args.num_cpus, num_gpus=args.num_gpus,
                          max_ongoing_requests=args.max_ongoing_requests,
                          health_check_period_s=args.health_check_period,
                          health_check_timeout_s=args.health_check_timeout,
                          **{k: v for k, v in chosen.items() if v is not None})


def run(args) -> int:
    try:
        import ray
        from ray import serve
    except ImportError as exc:
        raise RuntimeError(RAY_MISSING.format(error=exc)) from None
    from nanocore.ray.app import APP_NAME, build_application

    check_server_args(args)
    options = replica_options(args)
    options.check()
    config = engine_config_from_args(args)  # config errors before Ray starts
    logging.getLogger("nanocore").setLevel(logging.INFO)
    server = {"served_model_name": args.served_model_name, "api_key": args.api_key or os.environ.get(API_KEY_ENV),
              "max_waiting_requests": args.max_waiting_requests, "drain_timeout_s": args.drain_timeout,
              "max_body_mib": args.max_body_mib, "stream_interval": args.stream_interval,
              # the template's text, not its path: the ingress may run on another node
              "chat_template": load_chat_template(args.chat_template), "tool_call_parser": args.tool_call_parser}
    ray.init(address=args.ray_address, logging_level=getattr(logging, args.log_level.upper()))
    signal.signal(signal.SIGTERM, _interrupt)  # a service manager's stop drains like Ctrl-C
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        app = build_application(config, options, server, ray.cluster_resources().get("GPU", 0) > 0)
        serve.run(app, name=APP_NAME, route_prefix="/")
        count = f"{options.min_replicas}..{options.max_replicas}" if options.max_replicas else options.num_replicas
        print(f"nanocore serve-ray: {config.model} on http://{args.host}:{args.port}/v1 ({count} engine replicas)",
              flush=True)
        while True:
            time.sleep(1.0)
    finally:
        serve.shutdown()
        ray.shutdown()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt

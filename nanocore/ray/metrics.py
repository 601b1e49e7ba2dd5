"""The ingress's ``GET /metrics``: where requests went (each replica's engine keeps its own ``ServerMetrics``)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest


class RoutingMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.routed = Counter("nanocore:ray_requests_routed", "Requests (prompts) served, by engine replica",
                              ["replica"], registry=self.registry)
        self.unrouted = Counter("nanocore:ray_requests_unrouted", "Requests that ended before a replica took them",
                                registry=self.registry)

    def record(self, replica_id: str | None, num_requests: int) -> None:
        if replica_id is None:
            self.unrouted.inc(num_requests)
        else:
            self.routed.labels(replica=replica_id).inc(num_requests)

    def render(self) -> bytes:
        return generate_latest(self.registry)

"""Which replica serves a request: by load, with prefix-cache affinity (a Ray Serve request router).

A request's affinity key is a hash of its first prompt's first ``affinity_tokens`` token ids. Replicas are ranked for
the key by rendezvous hashing (stable when replicas come and go: only the keys of a replica that left move), and the
top one gets the request while its queue is at most ``load_slack`` requests longer than the least loaded replica's;
otherwise the least loaded of the others does. Requests that share a long prefix thus meet the same prefix cache.

Ray's own ``PrefixCacheAffinityRouter`` lives in ``ray.serve.llm``, which needs the ``ray[llm]`` extra (vLLM,
pyarrow); this is the small router its policy describes, on Ray Serve's public ``RequestRouter`` API.
"""
from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from nanocore.serve.request_state import NewRequest

DEFAULT_AFFINITY_TOKENS = 128  # long enough to cover a shared system prompt's start, short enough to be shared
DEFAULT_LOAD_SLACK = 4  # requests a preferred replica may queue beyond the least loaded one before load wins


@dataclass
class RoutedBatch:
    """One HTTP request's prompts (all accepted or none, on one replica) and the key the router places them by."""

    requests: list[NewRequest]
    affinity_key: str


def affinity_key(prompt_token_ids: list[int], affinity_tokens: int) -> str:
    head = array("q", prompt_token_ids[:affinity_tokens]).tobytes()
    return hashlib.blake2b(head, digest_size=8).hexdigest()


def rendezvous_order(key: str, replicas: list[RunningReplica]) -> list[RunningReplica]:
    """The replicas in the key's order of preference (highest random weight first)."""
    def weight(replica: RunningReplica) -> bytes:
        return hashlib.blake2b(f"{key}/{replica.replica_id.unique_id}".encode(), digest_size=8).digest()

    return sorted(replicas, key=weight, reverse=True)


class PrefixAffinityRouter(RequestRouter):
    def initialize_state(self, load_slack: int = DEFAULT_LOAD_SLACK, **kwargs) -> None:
        if load_slack < 0:
            raise ValueError(f"load_slack must be >= 0 (requests), got {load_slack}")
        self.load_slack = load_slack

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        """Ranks of replicas, best first; Ray Serve takes the least loaded replica of the first rank with room."""
        key = _key_of(pending_request)
        if key is None or len(candidate_replicas) < 2:
            return [candidate_replicas]
        ranked = rendezvous_order(key, candidate_replicas)
        loads = [self.replica_queue_len_cache.get(r.replica_id) or 0 for r in ranked]  # unknown: idle
        if loads[0] <= min(loads) + self.load_slack:
            return [ranked[:1], ranked[1:]]
        return [ranked[1:], ranked[:1]]


def _key_of(pending_request: PendingRequest | None) -> str | None:
    if pending_request is None or not pending_request.args:
        return None
    # not isinstance: Ray Serve ships this module to the router by value, with a copy of RoutedBatch
    return getattr(pending_request.args[0], "affinity_key", None)

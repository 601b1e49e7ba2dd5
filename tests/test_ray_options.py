"""nanocore.ray without a cluster: what a replica asks of Ray, the options' errors, and the router's choices."""
from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import pytest

from nanocore.config import EngineConfig

pytestmark = pytest.mark.ray


def resources(**fields):
    from nanocore.ray.app import ReplicaOptions, replica_resources

    options = fields.pop("options", ReplicaOptions())
    gpus = fields.pop("cluster_has_gpus", False)
    return replica_resources(EngineConfig.model_construct(**{"device": "cpu", "tensor_parallel_size": 1,
                                                              "expert_parallel_size": 1, **fields}), options, gpus)


def test_a_tensor_parallel_replica_reserves_its_gpus_as_one_placement_group():
    from nanocore.ray.app import ReplicaOptions

    tp2 = resources(device="cuda", tensor_parallel_size=2, options=ReplicaOptions(num_cpus=2))
    assert tp2["ray_actor_options"] == {"num_cpus": 2, "num_gpus": 2}
    assert tp2["placement_group_bundles"] == [{"CPU": 2, "GPU": 2}]
    assert tp2["placement_group_strategy"] == "STRICT_PACK"
    tp2_pp2 = resources(device="cuda", tensor_parallel_size=2, pipeline_parallel_size=2)
    assert tp2_pp2["ray_actor_options"]["num_gpus"] == 4 and tp2_pp2["placement_group_bundles"][0]["GPU"] == 4
    ep4 = resources(device="auto", tensor_parallel_size=2, expert_parallel_size=4, cluster_has_gpus=True)
    assert ep4["placement_group_bundles"] == [{"CPU": 1.0, "GPU": 4}]  # ranks = max(TP, EP)
    one = resources(device="auto", cluster_has_gpus=True)
    assert one == {"ray_actor_options": {"num_cpus": 1.0, "num_gpus": 1}}  # one GPU: no placement group
    cpu = resources(device="auto", tensor_parallel_size=2, options=ReplicaOptions(num_cpus=0.5))
    assert cpu == {"ray_actor_options": {"num_cpus": 0.5, "num_gpus": 0}}  # gloo ranks on a CPU-only cluster


@pytest.mark.parametrize("fields, message", [
    ({"device": "cuda:1"}, "use --device cuda"),
    ({"device": "cuda", "tensor_parallel_size": 2, "options": "one_gpu"}, "needs 2 GPUs"),
])
def test_resource_requests_that_cannot_work_are_refused(fields, message):
    from nanocore.ray.app import ReplicaOptions

    if fields.get("options") == "one_gpu":
        fields = {**fields, "options": ReplicaOptions(num_gpus=1)}
    with pytest.raises(ValueError, match=message):
        resources(**fields)


@pytest.mark.parametrize("fields, message", [
    ({"num_replicas": 0}, "--num-replicas must be >= 1"),
    ({"min_replicas": 1}, "needs both --min-replicas and --max-replicas"),
    ({"min_replicas": 3, "max_replicas": 2}, "--min-replicas <= --max-replicas"),
    ({"num_cpus": 0}, "--num-cpus must be > 0"),
    ({"num_gpus": -1}, "--num-gpus must be >= 0"),
    ({"load_slack": -1}, "--load-slack >= 0"),
])
def test_bad_options_say_which_flag(fields, message):
    from nanocore.ray.app import ReplicaOptions

    with pytest.raises(ValueError, match=message):
        ReplicaOptions(**fields).check()


def test_autoscaling_replaces_the_fixed_count():
    from nanocore.ray.app import ReplicaOptions, replica_count

    assert replica_count(ReplicaOptions(num_replicas=3)) == {"num_replicas": 3}
    scaled = replica_count(ReplicaOptions(min_replicas=0, max_replicas=4, target_ongoing_requests=8))
    assert scaled == {"autoscaling_config": {"min_replicas": 0, "max_replicas": 4, "initial_replicas": 1,
                                             "target_ongoing_requests": 8}}


def replica(unique_id: str):
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=unique_id))


def choose(replicas, key, loads, slack=2):
    from nanocore.ray.routing import PrefixAffinityRouter, RoutedBatch

    cache = SimpleNamespace(get=lambda replica_id: loads.get(replica_id.unique_id))
    router = SimpleNamespace(load_slack=slack, replica_queue_len_cache=cache)
    request = SimpleNamespace(args=[RoutedBatch([], key)]) if key is not None else None
    ranks = asyncio.run(PrefixAffinityRouter.choose_replicas(router, replicas, request))
    return [[r.replica_id.unique_id for r in rank] for rank in ranks]


def test_a_key_prefers_one_replica_until_it_is_busier_than_the_slack():
    from nanocore.ray.routing import affinity_key

    replicas = [replica(name) for name in "abcd"]
    key = affinity_key(list(range(200)), 128)
    assert key == affinity_key(list(range(128)) + [7] * 50, 128)  # only the first 128 tokens count
    first, rest = choose(replicas, key, {})
    assert len(first) == 1 and sorted(first + rest) == list("abcd")
    preferred = first[0]
    assert choose(replicas, key, {preferred: 2})[0] == [preferred]  # within the slack: affinity wins
    busy = choose(replicas, key, {preferred: 3})
    assert preferred not in busy[0] and busy[1] == [preferred]  # beyond it: the others first
    assert choose(replicas, None, {}) == [list("abcd")]  # no key (describe): Ray picks the least loaded


def test_rendezvous_keys_spread_and_only_a_lost_replicas_keys_move():
    from nanocore.ray.routing import affinity_key

    rng = random.Random(0)
    keys = [affinity_key([rng.randrange(50_000) for _ in range(16)], 16) for _ in range(400)]
    four = [replica(name) for name in "abcd"]
    before = {key: choose(four, key, {})[0][0] for key in keys}
    counts = {name: list(before.values()).count(name) for name in "abcd"}
    assert min(counts.values()) > 60, counts  # about 100 each
    after = {key: choose(four[:3], key, {})[0][0] for key in keys}  # replica d left
    assert all(after[key] == before[key] for key in keys if before[key] != "d")

"""The GPU request mix at start: rebuilt from the bound pods, by the same call that
``lattice explain`` makes, so a restarted or failed-over scheduler does not judge GPU pods
by the 1/2/4/8 prior while explain shows a mix learned from the cluster."""

from __future__ import annotations

import random
from typing import Any

from scheduler.control.explain import seed_gpu_demand
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import parse_spec
from scheduler.core.from_api import snapshot_from_api
from scheduler.core.topology.state import TopologyState
from scheduler.obs.metrics import Metrics
from tests.builders import make_node, make_pod

GPU = "nvidia.com/gpu"


def bound(name: str, gpus: int, cpu: str, created: str, node: str) -> dict[str, Any]:
    body = make_pod(name, cpu=cpu, memory="8Gi", resources={GPU: str(gpus)} if gpus else None)
    obj = body.obj()
    obj["metadata"]["creationTimestamp"] = created
    obj["metadata"]["resourceVersion"] = "10"
    obj["spec"]["nodeName"] = node
    obj["status"] = {"phase": "Running"}
    return obj


def cluster_bodies() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes = [
        make_node(f"n{i}", cpu="128", memory="1Ti").allocatable(**{GPU: 8}).obj() for i in range(4)
    ]
    sizes = [1, 1, 2, 8, 4, 1, 0, 2, 1, 4]
    pods = [
        bound(f"p{i}", g, str(1 + 3 * i), f"2026-01-01T00:00:{i:02d}Z", f"n{i % 4}")
        for i, g in enumerate(sizes)
    ]
    return nodes, pods


def started(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> Scheduler:
    sched = Scheduler(parse_spec({}, "lattice"), writer=None, metrics=Metrics.create())
    for node in nodes:
        sched.node_upserted(node)
    for body in pods:
        sched.pod_upserted(body)
    return sched


def test_start_rebuilds_the_mix_from_bound_pods_as_explain_does() -> None:
    nodes, pods = cluster_bodies()
    shuffled = list(pods)
    random.Random(7).shuffle(shuffled)  # the list's order is not the creation order
    sched = started(nodes, shuffled)
    demand = sched.cache.topology.gpu_demand
    assert demand.arrivals == 0  # bound pods are not arrivals as they are listed
    assert sched.rebuild_gpu_demand() == 9  # every bound pod asking for GPUs

    topology = TopologyState()
    snapshot = snapshot_from_api(nodes, pods, []).snapshot
    seed_gpu_demand(topology, sched.settings.profile, snapshot, pods, "lattice")
    assert topology.gpu_demand.arrivals == 9
    assert demand.classes() == topology.gpu_demand.classes()
    assert {c.gpus for c in demand.classes() if c.seen} == {1, 2, 4, 8}


def test_pods_gone_during_the_list_are_left_out_and_later_pods_are_not_rebuilt() -> None:
    nodes, pods = cluster_bodies()
    sched = started(nodes, pods)
    sched.pod_deleted(pods[3])  # the only 8-GPU pod, deleted before the sync ended
    assert sched.rebuild_gpu_demand() == 8
    assert not any(c.gpus == 8 and c.seen for c in sched.cache.topology.gpu_demand.classes())
    sched.pod_upserted(bound("late", 8, "4", "2026-01-01T00:01:00Z", "n0"))
    assert sched.rebuild_gpu_demand() == 0  # once, at start
    assert sched.cache.topology.gpu_demand.arrivals == 8


def test_pending_pods_listed_after_the_rebuild_are_arrivals_on_top() -> None:
    nodes, pods = cluster_bodies()
    sched = started(nodes, pods)
    sched.rebuild_gpu_demand()
    waiting = make_pod("w", cpu="4", memory="8Gi", resources={GPU: "8"}).obj()
    waiting["spec"]["schedulerName"] = "lattice"
    sched.pod_upserted(waiting)
    demand = sched.cache.topology.gpu_demand
    assert demand.arrivals == 10
    assert sum(c.share for c in demand.classes() if c.gpus == 8) >= 0.5  # pending weighs half

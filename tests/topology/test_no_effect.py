"""Pods that want no devices (or clusters without topology) decide exactly as without the plugin."""

from __future__ import annotations

import random

import pytest

from scheduler.core.explain import Decision
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.core.topology import TopologyState
from scheduler.model.pod import Pod
from tests.builders import make_node, make_pod
from tests.topology.support import (
    default_profile_without_topology,
    gpu_node,
    gpu_pod,
    two_socket,
)

LATTICE = Framework()
KUBE = Framework(default_profile_without_topology())


def _cluster(rng: random.Random) -> tuple[Snapshot, TopologyState]:
    nodes = []
    state = TopologyState()
    for i in range(rng.randint(1, 6)):
        name = f"n{i}"
        if rng.random() < 0.5:
            nodes.append(gpu_node(name, gpus=rng.choice((2, 4, 8))).build())
            if rng.random() < 0.7:
                state.set_node_topology(name, two_socket())
        else:
            nodes.append(make_node(name, cpu=str(rng.choice((4, 16, 96))), memory="64Gi").build())
    snapshot = Snapshot(nodes)
    for j in range(rng.randint(0, 8)):
        node = rng.choice(nodes).name
        pod = make_pod(f"old{j}", cpu=f"{rng.randint(1, 8) * 250}m", memory="1Gi").build()
        snapshot.add_pod(pod, node)
    return snapshot, state


def _plain_pod(rng: random.Random, name: str) -> Pod:
    cpu = str(rng.randint(1, 8))
    if rng.random() < 0.5:
        # Guaranteed with whole CPUs: pinned, but no node here enforces single-numa-node.
        return gpu_pod(name, 0, cpu=cpu, memory="1Gi", guaranteed=True).build()
    return make_pod(name, cpu=f"{cpu}00m", memory="512Mi").build()


def _same(ours: Decision, theirs: Decision) -> None:
    assert ours.selected == theirs.selected
    assert ours.summary == theirs.summary
    assert ours.code == theirs.code
    assert ours.reason_counts() == theirs.reason_counts()
    for name in ours.feasible:
        assert ours.explanation.node(name).total == theirs.explanation.node(name).total
    assert dict(ours.annotations) == {}


@pytest.mark.parametrize("seed", range(40))
def test_pods_without_devices_are_skipped(seed: int) -> None:
    rng = random.Random(seed)
    snapshot, state = _cluster(rng)
    for k in range(5):
        pod = _plain_pod(rng, f"p{k}")
        ours = LATTICE.schedule(snapshot, pod, seed=seed, topology=state)
        assert "Topology" in ours.explanation.skipped_filters
        if ours.feasible:
            assert "Topology" in ours.explanation.skipped_scores
        _same(ours, KUBE.schedule(snapshot, pod, seed=seed))


@pytest.mark.parametrize("seed", range(20))
def test_gpu_pods_without_any_topology_decide_as_kube(seed: int) -> None:
    """No topology state (or an empty one): GPUs counted by NodeResourcesFit, nothing else."""
    rng = random.Random(seed)
    snapshot, _ = _cluster(rng)
    for k in range(5):
        pod = gpu_pod(f"g{k}", rng.choice((1, 2, 4, 8)), nic=rng.random() < 0.3).build()
        theirs = KUBE.schedule(snapshot, pod, seed=seed)
        for state in (None, TopologyState()):
            ours = LATTICE.schedule(snapshot, pod, seed=seed, topology=state)
            _same(ours, theirs)

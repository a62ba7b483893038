"""Pinned CPUs on single-numa-node nodes, and the kubelet's policy applied to devices."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.core.framework import Code
from scheduler.model.topology import NodeTopology
from tests.topology.support import (
    Bed,
    devices,
    gpu_node,
    gpu_pod,
    holding,
    two_socket_with_kubelet,
)


@pytest.fixture
def single_numa(tmp_path: Path) -> NodeTopology:
    return two_socket_with_kubelet(tmp_path, "single-numa-node")


def test_guaranteed_pods_get_one_numa_node(single_numa: NodeTopology) -> None:
    bed = Bed([gpu_node("n")], {"n": single_numa})
    first = bed.place(gpu_pod("a", 0, cpu="30", guaranteed=True))
    second = bed.place(gpu_pod("b", 0, cpu="30", guaranteed=True))
    assert devices(first) == {"gpus": [], "nics": [], "numa": 0}
    assert devices(second) == {"gpus": [], "nics": [], "numa": 1}
    # 36 CPUs are free in total (NodeResourcesFit passes) but at most 18 on one NUMA node.
    third = bed.decide(gpu_pod("c", 0, cpu="30", guaranteed=True))
    assert third.summary == (
        "0/1 nodes are available: 1 node(s) didn't have 30 free CPUs on one NUMA node."
    )
    assert third.code is Code.UNSCHEDULABLE
    # Best fit: an 18-CPU pod takes what is left on NUMA node 0, not a fresh node.
    assert devices(bed.place(gpu_pod("d", 0, cpu="18", guaranteed=True))) == {
        "gpus": [],
        "nics": [],
        "numa": 0,
    }


def test_more_cpus_than_a_numa_node_has(single_numa: NodeTopology) -> None:
    decision = Bed([gpu_node("n")], {"n": single_numa}).decide(
        gpu_pod("big", 0, cpu="50", guaranteed=True)
    )
    assert decision.summary == (
        "0/1 nodes are available: 1 node(s) cannot pin 50 CPUs on one NUMA node."
    )
    assert decision.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE


@pytest.mark.parametrize(
    ("cpu", "guaranteed"),
    [
        pytest.param("50", False, id="burstable"),
        pytest.param("49500m", True, id="fractional-cpus-are-shared"),
    ],
)
def test_unpinned_pods_are_skipped(single_numa: NodeTopology, cpu: str, guaranteed: bool) -> None:
    decision = Bed([gpu_node("n")], {"n": single_numa}).decide(
        gpu_pod("p", 0, cpu=cpu, guaranteed=guaranteed)
    )
    assert decision.selected == "n"
    assert "Topology" in decision.explanation.skipped_filters


def test_other_policies_do_not_constrain_cpus(tmp_path: Path) -> None:
    best_effort = two_socket_with_kubelet(tmp_path, "best-effort")
    no_static = two_socket_with_kubelet(tmp_path, "single-numa-node", cpu_policy="none")
    for topology in (best_effort, no_static):
        decision = Bed([gpu_node("n")], {"n": topology}).place(
            gpu_pod("big", 0, cpu="50", guaranteed=True)
        )
        assert decision.selected == "n"
        assert "Topology" in decision.explanation.skipped_filters


def test_gpus_follow_the_numa_node_with_free_cpus(single_numa: NodeTopology) -> None:
    bed = Bed([gpu_node("n")], {"n": single_numa})
    bed.place(gpu_pod("a", 0, cpu="30", guaranteed=True))  # NUMA node 0: 18 CPUs left
    decision = bed.place(gpu_pod("g", 4, cpu="40", guaranteed=True))
    assert devices(decision) == {"gpus": [4, 5, 6, 7], "nics": [], "numa": 1}


def test_kubelet_reservation_comes_off_the_first_numa_node(single_numa: NodeTopology) -> None:
    bed = Bed([gpu_node("n", cpu="94")], {"n": single_numa})  # 2 CPUs reserved
    decision = bed.place(gpu_pod("p", 0, cpu="47", guaranteed=True))
    assert devices(decision) == {"gpus": [], "nics": [], "numa": 1}


def test_single_numa_node_policy_applies_to_preferred_gpu_pods(single_numa: NodeTopology) -> None:
    """The kubelet would reject a spanning placement, so the plugin does not make one."""
    bed = Bed([gpu_node("n")], {"n": single_numa})
    eight = bed.decide(gpu_pod("p", 8))
    assert eight.summary == (
        "0/1 nodes are available: 1 node(s) cannot hold 8 GPUs on one NUMA node."
    )
    holding(bed, "n", [0, 4])  # 6 GPUs free, 3 on each NUMA node
    four = bed.decide(gpu_pod("d", 4))
    assert four.summary == (
        "0/1 nodes are available: 1 node(s) didn't have 4 GPUs free on one NUMA node."
    )


def test_restricted_policy_requires_one_numa_node_only_when_hardware_allows(
    tmp_path: Path,
) -> None:
    restricted = two_socket_with_kubelet(tmp_path, "restricted")
    bed = Bed([gpu_node("n")], {"n": restricted})
    assert devices(bed.place(gpu_pod("eight", 8))) is not None
    bed.remove("eight")
    bed.place(gpu_pod("a", 1))
    bed.place(gpu_pod("b", 4))  # NUMA node 1 (NUMA node 0 has 3 left)
    decision = bed.decide(gpu_pod("c", 4))
    assert decision.selected is None

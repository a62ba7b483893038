"""Required alignment: strict, numa and preferred pods; nodes without a topology report."""

from __future__ import annotations

import pytest

from scheduler.core.framework import Code
from scheduler.core.topology import DEVICES_ANNOTATION
from tests.builders import make_node
from tests.topology.support import (
    Bed,
    devices,
    gpu_bed,
    gpu_node,
    gpu_pod,
    holding,
    two_socket,
)


@pytest.mark.parametrize(
    ("held", "gpus", "nic", "alignment", "want"),
    [
        # Every switch has one free GPU: a 2-GPU pod fits one NUMA node but no switch.
        pytest.param([0, 2, 4, 6], 2, False, "strict", None, id="strict-2-needs-a-switch"),
        pytest.param([0, 2, 4, 6], 2, False, "numa", [1, 3], id="numa-2-one-numa-node"),
        pytest.param([0, 2, 4, 6], 2, False, "preferred", [1, 3], id="preferred-2"),
        # One GPU used per NUMA node: 4 fit on neither NUMA node.
        pytest.param([0, 4], 4, False, "strict", None, id="strict-4-needs-a-numa-node"),
        pytest.param([0, 4], 4, False, "numa", None, id="numa-4-needs-a-numa-node"),
        # Spanning anyway: two whole switches, one per NUMA node, is the cheapest span.
        pytest.param([0, 4], 4, False, "preferred", [2, 3, 6, 7], id="preferred-4-spans"),
        pytest.param([0, 4, 6], 2, True, "strict", [2, 3], id="strict-2-nic-the-whole-switch"),
    ],
)
def test_required_alignment(
    held: list[int], gpus: int, nic: bool, alignment: str, want: list[int] | None
) -> None:
    bed = gpu_bed()
    holding(bed, "n0", held)
    decision = bed.place(gpu_pod("p", gpus, nic=nic, alignment=alignment))
    if want is None:
        assert decision.selected is None
        assert decision.code is Code.UNSCHEDULABLE
        assert decision.explanation.rejecting_plugins == {"Topology"}
    else:
        got = devices(decision)
        assert got is not None
        assert got["gpus"] == want


@pytest.mark.parametrize(
    ("held", "pod_gpus", "message"),
    [
        pytest.param(
            [0, 2, 4, 6], 2, "node(s) didn't have 2 GPUs free under one PCIe switch", id="switch"
        ),
        pytest.param([0, 4], 4, "node(s) didn't have 4 GPUs free on one NUMA node", id="numa"),
    ],
)
def test_strict_reasons(held: list[int], pod_gpus: int, message: str) -> None:
    bed = gpu_bed()
    holding(bed, "n0", held)
    decision = bed.decide(gpu_pod("p", pod_gpus, alignment="strict"))
    assert decision.summary == f"0/1 nodes are available: 1 {message}."


def test_strict_counts_the_nic() -> None:
    """Switch 1 is the only one with two free GPUs, but its NIC is taken."""
    bed = gpu_bed()
    holding(bed, "n0", [0, 4, 6])
    nic_holder = gpu_pod("nic-only", 0, nic=True).build()
    bed.bind(nic_holder, "n0", {DEVICES_ANNOTATION: '{"gpus":[],"nics":["0000:3f:00.0"]}'})
    decision = bed.decide(gpu_pod("p", 2, nic=True, alignment="strict"))
    assert decision.summary == (
        "0/1 nodes are available: 1 node(s) didn't have 2 GPUs and an RDMA NIC free under "
        "one PCIe switch."
    )
    # With numa alignment, [2,3]+1c, [1,2]+1c and [5,7]+9c all cost 90 (one PIX pair or
    # link, two NODE ones); [5,7] fills NUMA node 1 and leaves switch 1 whole.
    numa = bed.decide(gpu_pod("p", 2, nic=True, alignment="numa"))
    assert devices(numa) == {"gpus": [5, 7], "nics": ["0000:9c:00.0"], "numa": 1}


def test_strict_eight_gpus_never_fit_a_two_socket_node() -> None:
    """The hardware cannot hold 8 GPUs on one NUMA node: no pod leaving would help."""
    decision = gpu_bed().decide(gpu_pod("p", 8, alignment="strict"))
    assert decision.summary == (
        "0/1 nodes are available: 1 node(s) cannot hold 8 GPUs on one NUMA node."
    )
    assert decision.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    preferred = gpu_bed().decide(gpu_pod("p", 8))
    assert devices(preferred) == {"gpus": list(range(8)), "nics": [], "numa": None}


def test_strict_pod_on_a_node_without_topology_report() -> None:
    bed = Bed([gpu_node("bare")])
    decision = bed.decide(gpu_pod("p", 2, alignment="strict"))
    assert decision.summary == "0/1 nodes are available: 1 node(s) had no topology report."
    assert decision.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    # The same when the controller passes no topology state at all.
    no_state = bed.framework.schedule(bed.snapshot, gpu_pod("p", 2, alignment="numa").build())
    assert no_state.summary == decision.summary


def test_preferred_pod_on_a_node_without_topology_report() -> None:
    """GPUs are counted as kube does; alignment unknown: neutral score, nothing recorded."""
    bed = Bed([gpu_node("bare"), gpu_node("known")], {"known": two_socket()})
    decision = bed.decide(gpu_pod("p", 2))
    scores = {n: decision.explanation.node(n).scores["Topology"] for n in decision.feasible}
    assert scores["bare"] == 50
    assert scores["known"] > 50
    assert decision.selected == "known"
    only_bare = Bed([gpu_node("bare")]).place(gpu_pod("p", 2))
    assert only_bare.selected == "bare"
    assert dict(only_bare.annotations) == {}
    assert "Topology" in only_bare.explanation.skipped_scores


def test_counts_stay_with_node_resources_fit() -> None:
    """A node short of GPUs is NodeResourcesFit's, with kube-scheduler's reason."""
    bed = Bed([gpu_node("small", gpus=2)], {"small": two_socket()})
    decision = bed.decide(gpu_pod("p", 4, alignment="strict"))
    assert decision.summary == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."


def test_unknown_alignment_value_rejects_the_pod() -> None:
    decision = gpu_bed().decide(gpu_pod("p", 1, alignment="tight"))
    assert decision.selected is None
    assert "lattice.dev/gpu-alignment='tight'" in decision.summary
    assert decision.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    # On a pod that asks for no devices the annotation is ignored.
    plain = gpu_bed().decide(gpu_pod("q", 0, alignment="tight"))
    assert plain.selected == "n0"


def test_mixed_cluster_prefers_the_node_that_can_align() -> None:
    bed = Bed(
        [gpu_node("a"), gpu_node("b"), make_node("cpu-only", cpu="96", memory="1Ti")],
        {"a": two_socket(), "b": two_socket()},
    )
    holding(bed, "a", [0, 2, 4, 6])
    decision = bed.place(gpu_pod("p", 2, nic=True))
    assert decision.selected == "b"
    assert devices(decision) == {"gpus": [0, 1], "nics": ["0000:1c:00.0"], "numa": 0}

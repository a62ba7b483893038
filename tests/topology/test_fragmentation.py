"""Fragmentation: once devices are used, which nodes can still take aligned 4- or 8-GPU pods."""

from __future__ import annotations

import pytest

from tests.topology.support import Bed, gpu_node, gpu_pod, holding, two_socket

USED = {
    "spread": [0, 2, 4, 6],  # one GPU per switch: what lowest-index choice after spreading leaves
    "one-switch": [0, 1],
    "one-per-numa": [0, 4],
    "numa-0-full": [0, 1, 2, 3],
    "empty": [],
}


def fleet() -> Bed:
    bed = Bed([gpu_node(n) for n in USED], dict.fromkeys(USED, two_socket()))
    for node, gpus in USED.items():
        holding(bed, node, gpus)
    return bed


@pytest.mark.parametrize(
    ("gpus", "alignment", "fits"),
    [
        pytest.param(4, "strict", {"one-switch", "numa-0-full", "empty"}, id="aligned-4"),
        pytest.param(
            4,
            "preferred",
            {"spread", "one-switch", "one-per-numa", "numa-0-full", "empty"},
            id="any-4",
        ),
        pytest.param(2, "strict", {"one-switch", "one-per-numa", "numa-0-full", "empty"}, id="2"),
        pytest.param(8, "preferred", {"empty"}, id="8"),
    ],
)
def test_which_nodes_still_fit(gpus: int, alignment: str, fits: set[str]) -> None:
    decision = fleet().decide(gpu_pod("p", gpus, alignment=alignment))
    assert set(decision.feasible) == fits


def test_a_four_gpu_pod_goes_where_it_breaks_nothing() -> None:
    """Preferred 4-GPU pod: the node whose other NUMA node is already full, not the empty one."""
    decision = fleet().decide(gpu_pod("p", 4))
    assert decision.selected == "numa-0-full"


def test_after_churn_lattice_keeps_a_node_whole_for_eight_gpus() -> None:
    bed = Bed([gpu_node("a"), gpu_node("b")], {"a": two_socket(), "b": two_socket()})
    for i in range(6):
        bed.place(gpu_pod(f"s{i}", 1))
    for i in (0, 2, 4):
        bed.remove(f"s{i}")
    for i in range(6, 9):
        bed.place(gpu_pod(f"s{i}", 1))
    assert bed.place(gpu_pod("big", 8)).selected is not None

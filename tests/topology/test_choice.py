"""Device choice on the two-socket fixture: which GPUs, NICs and NUMA node a pod gets."""

from __future__ import annotations

import pytest

from tests.topology.support import (
    NIC_OF_SWITCH,
    devices,
    gpu_bed,
    gpu_pod,
    holding,
    single_gpu_vm,
)

ALL = list(range(8))


@pytest.mark.parametrize(
    ("gpus", "nic", "want_gpus", "want_nics", "want_numa"),
    [
        pytest.param(1, False, [0], [], 0, id="1-gpu"),
        pytest.param(1, True, [0], [NIC_OF_SWITCH[0]], 0, id="1-gpu-nic"),
        pytest.param(2, False, [0, 1], [], 0, id="2-gpu-one-switch"),
        pytest.param(2, True, [0, 1], [NIC_OF_SWITCH[0]], 0, id="2-gpu-nic-one-switch"),
        pytest.param(4, False, [0, 1, 2, 3], [], 0, id="4-gpu-one-numa"),
        pytest.param(4, True, [0, 1, 2, 3], [NIC_OF_SWITCH[0]], 0, id="4-gpu-nic-one-numa"),
        pytest.param(8, False, ALL, [], None, id="8-gpu-whole-node"),
        pytest.param(8, True, ALL, [NIC_OF_SWITCH[0]], None, id="8-gpu-nic"),
    ],
)
def test_choice_on_an_empty_node(
    gpus: int, nic: bool, want_gpus: list[int], want_nics: list[str], want_numa: int | None
) -> None:
    decision = gpu_bed().place(gpu_pod("p", gpus, nic=nic))
    assert decision.selected == "n0"
    assert devices(decision) == {"gpus": want_gpus, "nics": want_nics, "numa": want_numa}


@pytest.mark.parametrize(
    ("held", "gpus", "nic", "want_gpus", "want_nics"),
    [
        # The sibling of a used GPU first: it keeps whole switches for 2-GPU pods.
        pytest.param([0], 1, False, [1], [], id="1-gpu-fills-a-started-switch"),
        # A whole free switch rather than one GPU from each of two switches.
        pytest.param([0], 2, False, [2, 3], [], id="2-gpu-takes-a-whole-switch"),
        pytest.param([0], 2, True, [2, 3], [NIC_OF_SWITCH[1]], id="2-gpu-nic-same-switch"),
        # The NUMA node that already has a pod, so NUMA node 1 stays whole.
        pytest.param([0], 3, False, [1, 2, 3], [], id="3-gpu-stays-on-started-numa"),
        pytest.param([0, 1], 4, False, [4, 5, 6, 7], [], id="4-gpu-on-the-free-numa"),
        # GPU 1 is free but its NIC's switch-mate is what a 1-GPU+NIC pod should use.
        pytest.param([0], 1, True, [1], [NIC_OF_SWITCH[0]], id="1-gpu-nic-next-to-gpu"),
    ],
)
def test_choice_after_some_gpus_are_used(
    held: list[int], gpus: int, nic: bool, want_gpus: list[int], want_nics: list[str]
) -> None:
    bed = gpu_bed()
    holding(bed, "n0", held)
    decision = bed.place(gpu_pod("p", gpus, nic=nic))
    got = devices(decision)
    assert got is not None
    assert (got["gpus"], got["nics"]) == (want_gpus, want_nics)


def test_exclusive_nics_are_consumed_and_shared_ones_are_not() -> None:
    bed = gpu_bed()
    first = bed.place(gpu_pod("a", 2, nic=True))
    second = bed.place(gpu_pod("b", 2, nic=True))
    assert devices(first) == {"gpus": [0, 1], "nics": [NIC_OF_SWITCH[0]], "numa": 0}
    assert devices(second) == {"gpus": [2, 3], "nics": [NIC_OF_SWITCH[1]], "numa": 0}
    bed = gpu_bed()
    bed.place(gpu_pod("a", 1, rdma_annotation=True))
    shared = bed.place(gpu_pod("b", 1, rdma_annotation=True))
    # The annotation asks for a NIC near the GPU without consuming it.
    assert devices(shared) == {"gpus": [1], "nics": [NIC_OF_SWITCH[0]], "numa": 0}


def test_the_fullest_node_is_filled_first() -> None:
    bed = gpu_bed(3)
    first = bed.place(gpu_pod("a", 1))
    for name in "bcdefg":
        assert bed.place(gpu_pod(name, 1)).selected == first.selected
    # Two untouched nodes stay whole for 8-GPU pods.
    eight = bed.place(gpu_pod("big", 8))
    assert eight.selected not in (None, first.selected)
    assert bed.place(gpu_pod("big2", 8)).selected not in (None, first.selected, eight.selected)


def test_aligned_node_beats_a_fragmented_one() -> None:
    bed = gpu_bed(2)
    holding(bed, "n0", [0, 2, 4, 6])  # one GPU used on every switch
    # n1: two whole switches used, the other two whole.
    for i, pair in enumerate([(0, 1), (2, 3)]):
        pod = gpu_pod(f"k{i}", 2).build()
        text = f'{{"gpus":[{pair[0]},{pair[1]}],"nics":[],"numa":0}}'
        bed.bind(pod, "n1", {"lattice.dev/devices": text})
    decision = bed.place(gpu_pod("p", 2, nic=True))
    assert decision.selected == "n1"
    scores = {n: decision.explanation.node(n).scores["Topology"] for n in decision.feasible}
    assert scores["n1"] > scores["n0"]


def test_single_gpu_vm_without_switches() -> None:
    """One NUMA node, one GPU on a root port, numa_node -1: still a report, still aligned."""
    bed = gpu_bed(topology=single_gpu_vm())
    decision = bed.place(gpu_pod("p", 1, alignment="strict"))
    assert devices(decision) == {"gpus": [0], "nics": [], "numa": 0}

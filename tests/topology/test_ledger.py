"""The device annotation round trip: decision -> binding annotation -> ledger -> next pod."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from scheduler.core.topology import DEVICES_ANNOTATION, DeviceAssignment, TopologyState
from scheduler.model.pod import Pod
from tests.topology.support import Bed, devices, gpu_bed, gpu_node, gpu_pod, two_socket


@pytest.mark.parametrize(
    "assignment",
    [
        pytest.param(DeviceAssignment((0, 1), ("0000:1c:00.0",), 0), id="gpus-nic-numa"),
        pytest.param(DeviceAssignment(tuple(range(8)), (), None), id="spanning"),
        pytest.param(DeviceAssignment((), (), 1), id="numa-only"),
    ],
)
def test_annotation_round_trip(assignment: DeviceAssignment) -> None:
    text = assignment.to_annotation()
    assert DeviceAssignment.from_annotation(text) == assignment


def test_annotation_format_is_the_documented_one() -> None:
    text = DeviceAssignment((0, 1), ("0000:3b:00.0",), 0).to_annotation()
    assert text == '{"gpus":[0,1],"nics":["0000:3b:00.0"],"numa":0}'


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("not json", id="not-json"),
        pytest.param("[0, 1]", id="not-an-object"),
        pytest.param('{"gpus": [-1]}', id="negative-index"),
        pytest.param('{"gpus": ["0"]}', id="string-index"),
        pytest.param('{"gpus": [true]}', id="bool-index"),
        pytest.param('{"nics": [3]}', id="nic-not-an-address"),
        pytest.param('{"numa": "0"}', id="numa-string"),
    ],
)
def test_malformed_annotations_are_not_ours(text: str) -> None:
    assert DeviceAssignment.from_annotation(text) is None


def bound(pod_body: dict[str, Any], node: str, annotations: dict[str, str]) -> Pod:
    """The pod as the API server returns it after a binding that carried ``annotations``."""
    body = copy.deepcopy(pod_body)
    body["metadata"].setdefault("annotations", {}).update(annotations)
    body["spec"]["nodeName"] = node
    body["status"] = {"phase": "Running"}
    return Pod.from_api(body)


def free_gpus(bed: Bed, node: str) -> list[int]:
    free = bed.state.free(node, 96)
    assert free is not None
    return [int(i) for i in free.gpus.nonzero()[0]]


def test_restart_rebuilds_the_same_usage_from_bound_pods() -> None:
    """Write -> ledger -> next pod: a fresh state fed the bound pods decides identically."""
    bed = gpu_bed(2)
    bound_pods: list[tuple[Pod, str]] = []
    for i, (gpus, nic) in enumerate([(1, False), (2, True), (1, True), (4, False)]):
        builder = gpu_pod(f"p{i}", gpus, nic=nic)
        decision = bed.place(builder)
        assert decision.selected is not None
        assert DEVICES_ANNOTATION in decision.annotations
        bound_pods.append(
            (bound(builder.obj(), decision.selected, dict(decision.annotations)), decision.selected)
        )

    restarted = Bed([gpu_node("n0"), gpu_node("n1")], {"n0": two_socket(), "n1": two_socket()})
    for pod, node in bound_pods:
        restarted.bind(pod, node, pod.annotations)
    for node in ("n0", "n1"):
        assert free_gpus(restarted, node) == free_gpus(bed, node)
    for i, (gpus, nic) in enumerate([(2, True), (1, False), (4, False), (8, False)]):
        before = bed.place(gpu_pod(f"q{i}", gpus, nic=nic))
        after = restarted.place(gpu_pod(f"q{i}", gpus, nic=nic))
        assert (after.selected, devices(after)) == (before.selected, devices(before))


def test_next_pod_sees_recorded_devices_as_used() -> None:
    bed = gpu_bed()
    pod = gpu_pod("a", 2).build()
    bed.bind(pod, "n0", {DEVICES_ANNOTATION: '{"gpus":[4,5],"nics":[],"numa":1}'})
    decision = bed.place(gpu_pod("b", 2))
    # GPUs 4 and 5 are taken; NUMA node 1's other switch is the packing choice.
    assert devices(decision) == {"gpus": [6, 7], "nics": [], "numa": 1}
    bed.remove("a")
    assert devices(bed.place(gpu_pod("c", 2))) == {"gpus": [4, 5], "nics": [], "numa": 1}


def test_unattributed_pods_hold_the_lowest_indexes() -> None:
    """A GPU pod placed by someone else: counted, guessed to hold the lowest free GPUs."""
    bed = gpu_bed()
    foreign = gpu_pod("foreign", 3).build()
    bed.bind(foreign, "n0", {})
    decision = bed.place(gpu_pod("p", 1))
    assert devices(decision) == {"gpus": [3], "nics": [], "numa": 0}


def test_assume_then_forget_on_failed_binding() -> None:
    bed = gpu_bed()
    decision = bed.place(gpu_pod("a", 8))
    assert free_gpus(bed, "n0") == []
    bed.state.pod_removed(decision.pod.key)
    assert free_gpus(bed, "n0") == list(range(8))


def test_replaying_the_same_pod_is_idempotent() -> None:
    state = TopologyState()
    state.set_node_topology("n0", two_socket())
    pod = gpu_pod("a", 2).build()
    annotations = {DEVICES_ANNOTATION: '{"gpus":[0,1],"nics":[],"numa":0}'}
    state.pod_placed(pod, "n0", annotations)
    generation = state.ledger.generation("n0")
    state.pod_placed(pod, "n0", annotations)
    assert state.ledger.generation("n0") == generation
    assert len(state.ledger) == 1
    # A pod that moved (deleted and recreated elsewhere under the same key) moves with it.
    state.pod_placed(pod, "n1", annotations)
    assert [k for k, _ in state.ledger.holdings("n0")] == []
    assert [k for k, _ in state.ledger.holdings("n1")] == [pod.key]


def test_plain_pods_are_not_recorded() -> None:
    state = TopologyState()
    state.pod_placed(gpu_pod("web", 0).build(), "n0")
    assert len(state.ledger) == 0

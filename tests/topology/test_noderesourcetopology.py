"""NodeResourceTopology objects: parsing, and placement on nodes known only from them."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from scheduler.model.noderesourcetopology import NodeResourceTopology
from scheduler.model.topology import (
    TopologyManagerPolicy,
    TopologyManagerScope,
    TopologyParseError,
)
from tests.topology.support import Bed, devices, gpu_node, gpu_pod, two_socket


def zone(numa: int, *, gpus: int = 4, gpus_free: int | None = None, cpus: str = "48") -> Any:
    return {
        "name": f"node-{numa}",
        "type": "Node",
        "costs": [
            {"name": "node-0", "value": 10 if numa == 0 else 21},
            {"name": "node-1", "value": 21 if numa == 0 else 10},
        ],
        "resources": [
            {"name": "cpu", "capacity": cpus, "allocatable": cpus, "available": cpus},
            {"name": "memory", "capacity": "512Gi", "allocatable": "500Gi", "available": "400Gi"},
            {
                "name": "nvidia.com/gpu",
                "capacity": str(gpus),
                "allocatable": str(gpus),
                "available": str(gpus if gpus_free is None else gpus_free),
            },
        ],
    }


def nrt(name: str = "n", **kwargs: Any) -> dict[str, Any]:
    """A v1alpha2 object as NFD's topology-updater writes it."""
    body: dict[str, Any] = {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": name},
        "attributes": [
            {"name": "topologyManagerPolicy", "value": "single-numa-node"},
            {"name": "topologyManagerScope", "value": "pod"},
        ],
        "zones": [zone(0, **kwargs), zone(1)],
    }
    return body


def test_parse_v1alpha2() -> None:
    parsed = NodeResourceTopology.from_api(nrt())
    assert parsed.node_name == "n"
    assert parsed.numa_ids == (0, 1)
    assert parsed.topology_manager_policy is TopologyManagerPolicy.SINGLE_NUMA_NODE
    assert parsed.topology_manager_scope is TopologyManagerScope.POD
    assert parsed.distances() == ((10, 21), (21, 10))
    z0 = parsed.zones[0]
    assert z0.allocatable("cpu") == 48_000
    assert z0.available("memory") == 400 * 2**30
    assert z0.allocatable("nvidia.com/gpu") == 4
    assert z0.allocatable("rdma/hca") == 0


def test_parse_legacy_policies_and_other_zone_types() -> None:
    body = nrt()
    del body["attributes"]
    body["topologyPolicies"] = ["SingleNUMANodeContainerLevel"]
    body["zones"].append({"name": "core-3", "type": "Core", "parent": "node-0"})
    body["zones"][1]["costs"] = []  # missing distances fall back to 10/20
    parsed = NodeResourceTopology.from_api(body)
    assert parsed.topology_manager_policy is TopologyManagerPolicy.SINGLE_NUMA_NODE
    assert parsed.topology_manager_scope is TopologyManagerScope.CONTAINER
    assert parsed.numa_ids == (0, 1)
    assert parsed.distances() == ((10, 21), (20, 10))


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda b: b.update(zones={"node-0": {}}), id="zones-not-a-list"),
        pytest.param(lambda b: b["zones"][0]["resources"][0].update(capacity="lots"), id="qty"),
        pytest.param(lambda b: b["metadata"].pop("name"), id="no-name"),
        pytest.param(lambda b: b["zones"][0]["costs"][1].update(value="far"), id="cost"),
        pytest.param(lambda b: b["attributes"][0].update(value="sometimes"), id="policy"),
    ],
)
def test_malformed_objects_raise(mutate: Any) -> None:
    body = copy.deepcopy(nrt())
    mutate(body)
    with pytest.raises(TopologyParseError):
        NodeResourceTopology.from_api(body)


def nrt_bed(**kwargs: Any) -> Bed:
    bed = Bed([gpu_node("n")])
    bed.state.set_node_resource_topology(NodeResourceTopology.from_api(nrt(**kwargs)))
    return bed


def test_numa_only_placement_records_the_numa_node() -> None:
    bed = nrt_bed()
    first = bed.place(gpu_pod("a", 2, alignment="strict"))
    second = bed.place(gpu_pod("b", 2, alignment="strict"))
    third = bed.place(gpu_pod("c", 2, alignment="strict"))
    # No device identities in a NodeResourceTopology: only the NUMA node is recorded.
    assert devices(first) == {"gpus": [], "nics": [], "numa": 0}
    assert devices(second) == {"gpus": [], "nics": [], "numa": 0}
    assert devices(third) == {"gpus": [], "nics": [], "numa": 1}
    # Two NUMA-node-sized holes: one more 4-GPU pod cannot fit on one NUMA node.
    bed.remove("b")
    assert bed.decide(gpu_pod("d", 4)).selected is None


def test_available_from_the_exporter_caps_what_is_free() -> None:
    """GPUs held by pods Lattice did not place show up only as lower ``available``."""
    bed = nrt_bed(gpus_free=1)
    decision = bed.place(gpu_pod("a", 2, alignment="strict"))
    assert devices(decision) == {"gpus": [], "nics": [], "numa": 1}


def test_single_numa_policy_from_the_object_applies() -> None:
    bed = nrt_bed()
    assert bed.decide(gpu_pod("a", 8)).summary == (
        "0/1 nodes are available: 1 node(s) cannot hold 8 GPUs on one NUMA node."
    )
    cpu = bed.place(gpu_pod("b", 0, cpu="40", guaranteed=True))
    assert devices(cpu) == {"gpus": [], "nics": [], "numa": 0}


def test_node_topology_wins_over_node_resource_topology() -> None:
    bed = nrt_bed()
    bed.state.set_node_topology("n", two_socket())
    # The agent's report has no kubelet policy: a spanning 8-GPU choice is allowed there.
    assert devices(bed.decide(gpu_pod("x", 8))) == {
        "gpus": list(range(8)),
        "nics": [],
        "numa": None,
    }
    first = bed.place(gpu_pod("a", 2))
    assert devices(first) == {"gpus": [0, 1], "nics": [], "numa": 0}
    bed.state.remove_node_topology("n")
    # Back to the NUMA-only view, where the same ledger says NUMA node 0 has 2 GPUs left.
    second = bed.place(gpu_pod("b", 4, alignment="strict"))
    assert devices(second) == {"gpus": [], "nics": [], "numa": 1}

"""scheduler.model.topology: cpulists, the wire format round trip, locality queries."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from scheduler.model.topology import (
    DeviceClass,
    KubeletHints,
    NodeTopology,
    NodeTopologyStatus,
    NumaNode,
    PciDevice,
    PcieLink,
    PcieSwitch,
    PcieTopology,
    Pressure,
    PressureLine,
    PressureReadings,
    RootComplex,
    TopologyManagerPolicy,
    TopologyManagerScope,
    TopologyParseError,
    format_cpulist,
    format_time,
    parse_cpulist,
    parse_time,
    pci_sort_key,
)
from tests.agent.trees import ALL, TWO_SOCKET, VM, read_fixture


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        pytest.param("", set(), id="empty"),
        pytest.param("0", {0}, id="single"),
        pytest.param("0-3", {0, 1, 2, 3}, id="range"),
        pytest.param("0-1,4,6-7", {0, 1, 4, 6, 7}, id="mixed"),
        pytest.param("0-23,48-71\n", set(range(24)) | set(range(48, 72)), id="two-socket"),
    ],
)
def test_parse_cpulist(text: str, cpus: set[int]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["a", "1-", "-1", "3-1", "1,,2", "1 2"])
def test_parse_cpulist_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="cpulist"):
        parse_cpulist(text)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [
        pytest.param([], "", id="empty"),
        pytest.param([5], "5", id="single"),
        pytest.param([3, 1, 2, 0], "0-3", id="unsorted"),
        pytest.param([0, 1, 4, 6, 7], "0-1,4,6-7", id="mixed"),
    ],
)
def test_format_cpulist_is_canonical(cpus: list[int], text: str) -> None:
    assert format_cpulist(cpus) == text
    assert parse_cpulist(text) == set(cpus)


def test_pci_sort_key_is_numeric() -> None:
    addresses = ["0000:b3:00.0", "0000:1a:00.0", "0001:00:00.0", "0000:1a:00.1", "0000:9a:00.0"]
    assert sorted(addresses, key=pci_sort_key) == [
        "0000:1a:00.0",
        "0000:1a:00.1",
        "0000:9a:00.0",
        "0000:b3:00.0",
        "0001:00:00.0",
    ]


def _hand_built() -> NodeTopology:
    """Every optional field set at least once, including a switch cascade."""
    return NodeTopology(
        numa_nodes=(
            NumaNode(0, frozenset({0, 1}), 1 << 30, (10, 32)),
            NumaNode(2, frozenset(), 0, (32, 10)),  # ids may have gaps; CPU-less node
        ),
        pcie=PcieTopology(
            root_complexes=(RootComplex("pci0000:00", 0), RootComplex("pci0000:80")),
            switches=(
                PcieSwitch(
                    "0000:01:00.0", "pci0000:00", "0x1000", "0xc030", ("0000:02:00.0",),
                    root_port="0000:00:01.0", numa_node=0,
                ),
                PcieSwitch(
                    "0000:03:00.0", "pci0000:00", "0x1000", "0xc030", ("0000:04:08.0",),
                    root_port="0000:00:01.0", parent_switch="0000:01:00.0", numa_node=0,
                ),
            ),
            devices=(
                PciDevice(
                    "0000:05:00.0", DeviceClass.GPU, "0x030200", "0x10de", "0x2331",
                    "pci0000:00", numa_node=0, root_port="0000:00:01.0", switch="0000:03:00.0",
                    resource_name="nvidia.com/gpu", device_index=0,
                ),
                PciDevice(
                    "0000:06:00.0", DeviceClass.NIC, "0x020700", "0x15b3", "0x1021",
                    "pci0000:00", numa_node=0, root_port="0000:00:01.0", switch="0000:01:00.0",
                    resource_name="rdma/hca", device_index=0,
                    net_devices=("ibp6s0",), rdma_devices=("mlx5_0",),
                ),
                PciDevice(
                    "0000:81:00.0", DeviceClass.OTHER, "0xff0000", "0x8086", "0x0001",
                    "pci0000:80",
                ),
            ),
        ),
        kubelet=KubeletHints(
            topology_manager_policy=TopologyManagerPolicy.SINGLE_NUMA_NODE,
            topology_manager_scope=TopologyManagerScope.POD,
        ),
    )  # fmt: skip


@pytest.mark.parametrize("name", ALL)
def test_round_trip_of_fixtures(name: str) -> None:
    topology = read_fixture(name).topology
    assert NodeTopology.from_spec(topology.to_spec()) == topology


def test_round_trip_of_every_optional_field() -> None:
    topology = _hand_built()
    spec = topology.to_spec()
    assert NodeTopology.from_spec(spec) == topology
    assert spec["summary"] == {
        "numaNodes": 2,
        "cpus": 2,
        "memoryBytes": 1 << 30,
        "gpus": 1,
        "nics": 1,
        "switches": 2,
    }
    assert spec["kubelet"] == {
        "topologyManagerPolicy": "single-numa-node",
        "topologyManagerScope": "pod",
    }


def _broken(path: str, value: Any) -> dict[str, Any]:
    spec: dict[str, Any] = copy.deepcopy(dict(_hand_built().to_spec()))
    *parents, last = path.split(".")
    target: Any = spec
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if value is KeyError:
        del target[last]
    elif isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return spec


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(_broken("numaNodes", []), id="no-numa-nodes"),
        pytest.param(_broken("numaNodes", "0"), id="numa-not-a-list"),
        pytest.param(_broken("numaNodes.0.cpus", "0-x"), id="bad-cpulist"),
        pytest.param(_broken("numaNodes.0.cpuCount", 3), id="cpu-count-disagrees"),
        pytest.param(_broken("numaNodes.0.id", "0"), id="id-not-int"),
        pytest.param(_broken("numaNodes.0.id", True), id="id-bool"),
        pytest.param(_broken("numaNodes.0.distances", [10]), id="short-distance-row"),
        pytest.param(_broken("numaNodes.1.id", 0), id="duplicate-numa-id"),
        pytest.param(_broken("pcie", KeyError), id="no-pcie"),
        pytest.param(_broken("pcie.devices.0.class", "tpu"), id="unknown-class"),
        pytest.param(_broken("pcie.devices.0.address", KeyError), id="device-without-address"),
        pytest.param(_broken("pcie.devices.0", "gpu"), id="device-not-object"),
        pytest.param(_broken("pcie.switches.0.downstreamPorts", [1]), id="port-not-string"),
        pytest.param(_broken("kubelet.topologyManagerPolicy", "always"), id="unknown-policy"),
    ],
)
def test_from_spec_rejects_garbage(spec: dict[str, Any]) -> None:
    with pytest.raises(TopologyParseError):
        NodeTopology.from_spec(spec)


def test_status_round_trip() -> None:
    line = PressureLine(avg10=1.5, avg60=0.25, avg300=0.0, total_us=123)
    status = NodeTopologyStatus(
        last_report_time=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
        pressure=PressureReadings(cpu=Pressure(line), io=Pressure(line, full=line)),
        warnings=("w1",),
    )
    raw = status.to_status()
    assert raw["lastReportTime"] == "2025-01-02T03:04:05Z"
    assert "memory" not in raw["pressure"]
    assert NodeTopologyStatus.from_status(raw) == status
    with pytest.raises(TopologyParseError):
        NodeTopologyStatus.from_status({"lastReportTime": 5})


def test_times_are_utc_rfc3339() -> None:
    cest = timezone(timedelta(hours=2))
    assert format_time(datetime(2025, 6, 1, 14, 0, tzinfo=cest)) == "2025-06-01T12:00:00Z"
    assert parse_time("2025-06-01T12:00:00Z") == datetime(2025, 6, 1, 12, tzinfo=UTC)
    with pytest.raises(ValueError, match="aware"):
        format_time(datetime(2025, 6, 1))


def test_distance_rows_must_match_node_count() -> None:
    with pytest.raises(ValueError, match="distances"):
        NodeTopology(numa_nodes=(NumaNode(0, frozenset({0}), 0, (10, 21)),))


@pytest.mark.parametrize(
    ("a", "b", "link", "cost"),
    [
        pytest.param("0000:1a:00.0", "0000:1a:00.0", PcieLink.SAME, 0, id="same"),
        pytest.param("0000:1a:00.0", "0000:1b:00.0", PcieLink.PIX, 10, id="gpu-gpu-switch"),
        pytest.param("0000:1a:00.0", "0000:1c:00.0", PcieLink.PIX, 10, id="gpu-nic-switch"),
        pytest.param("0000:1a:00.0", "0000:3d:00.0", PcieLink.NODE, 40, id="other-stack"),
        pytest.param("0000:1a:00.0", "0000:5e:00.0", PcieLink.NODE, 40, id="gpu-nvme"),
        pytest.param("0000:1a:00.0", "0000:9a:00.0", PcieLink.SYS, 61, id="cross-socket"),
        pytest.param("0000:b5:00.0", "0000:3e:00.0", PcieLink.SYS, 61, id="nic-cross-socket"),
        pytest.param("0000:01:00.0", "0000:03:00.0", PcieLink.PHB, 30, id="same-root-complex"),
    ],
)
def test_link_and_distance_on_two_socket(a: str, b: str, link: PcieLink, cost: int) -> None:
    topology = read_fixture(TWO_SOCKET).topology
    assert topology.link(a, b) is link
    assert topology.link(b, a) is link
    assert topology.distance(a, b) == cost == topology.distance(b, a)


def test_cascaded_switches_and_unknown_numa() -> None:
    topology = _hand_built()
    # GPU below the inner switch, NIC below the outer one: more than one switch -> PXB.
    assert topology.link("0000:05:00.0", "0000:06:00.0") is PcieLink.PXB
    # Unknown NUMA node on a different root complex: charged the worst SLIT distance.
    assert topology.link("0000:05:00.0", "0000:81:00.0") is PcieLink.SYS
    assert topology.distance("0000:05:00.0", "0000:81:00.0") == 50 + (32 - 10)
    assert topology.numa_distance(0, 2) == 32
    assert topology.numa_node(2).cpu_count == 0


def test_vm_devices_share_the_root_complex() -> None:
    topology = read_fixture(VM).topology
    (gpu,) = topology.gpus
    (nic,) = topology.nics
    assert topology.link(gpu.address, nic.address) is PcieLink.PHB
    assert topology.gpus_by_switch() == {"pci0000:00": (gpu,)}

"""The reader on the fixture trees, on broken trees, and on this machine's /sys and /proc."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from scheduler.agent.pci import DEFAULT_NAMING, ResourceNaming, classify, read_pcie
from scheduler.agent.reader import INTERNAL_ERROR, read_node
from scheduler.agent.sysfs import Notes
from scheduler.model.topology import DeviceClass, NodeTopology
from tests.agent.trees import ALL, BROKEN, NO_NUMA, TWO_SOCKET, VM, read_fixture, roots

GPUS_BY_SWITCH = {
    "0000:18:00.0": ["0000:1a:00.0", "0000:1b:00.0"],
    "0000:3b:00.0": ["0000:3d:00.0", "0000:3e:00.0"],
    "0000:98:00.0": ["0000:9a:00.0", "0000:9b:00.0"],
    "0000:b1:00.0": ["0000:b3:00.0", "0000:b4:00.0"],
}


@pytest.mark.parametrize("name", ALL)
def test_fixtures_never_hit_an_internal_error(name: str) -> None:
    assert not [w for w in read_fixture(name).warnings if w.startswith(INTERNAL_ERROR)]


@pytest.mark.parametrize("name", [TWO_SOCKET, VM])
def test_good_fixtures_read_without_warnings(name: str) -> None:
    assert read_fixture(name).warnings == ()


class TestTwoSocket:
    topology: NodeTopology = read_fixture(TWO_SOCKET).topology

    def test_numa_nodes(self) -> None:
        nodes = self.topology.numa_nodes
        assert [n.id for n in nodes] == [0, 1]
        assert [n.cpulist for n in nodes] == ["0-23,48-71", "24-47,72-95"]
        assert [n.cpu_count for n in nodes] == [48, 48]
        assert self.topology.cpu_count == 96
        assert [n.memory_bytes for n in nodes] == [527958428 * 1024, 528444924 * 1024]
        assert [n.distances for n in nodes] == [(10, 21), (21, 10)]
        assert self.topology.numa_distance(0, 1) == 21

    def test_device_counts(self) -> None:
        counts = Counter(d.device_class for d in self.topology.pcie.devices)
        assert counts == {
            DeviceClass.GPU: 8,
            DeviceClass.NIC: 5,  # 4 ConnectX-7 and the X710 management port
            DeviceClass.NVME: 2,
            DeviceClass.OTHER: 2,  # SATA controller, BMC VGA (ASPEED is not a GPU)
        }
        assert len(self.topology.pcie.switches) == 4
        assert len(self.topology.pcie.root_complexes) == 8

    def test_plumbing_is_not_reported(self) -> None:
        addresses = {d.address for d in self.topology.pcie.devices}
        # host bridge, CBDMA, uncore, root ports, switch ports, the ASPEED bridge
        for plumbing in ["0000:00:00.0", "0000:00:04.0", "0000:17:00.0", "0000:17:02.0",
                         "0000:18:00.0", "0000:19:00.0", "0000:02:00.0"]:  # fmt: skip
            assert plumbing not in addresses

    def test_gpus_grouped_by_switch(self) -> None:
        groups = self.topology.gpus_by_switch()
        assert {k: [d.address for d in v] for k, v in groups.items()} == GPUS_BY_SWITCH
        for switch, gpus in groups.items():
            (nic,) = [d for d in self.topology.nics if d.switch == switch]
            assert {g.numa_node for g in gpus} == {nic.numa_node}

    def test_switches(self) -> None:
        by_id = {s.id: s for s in self.topology.pcie.switches}
        assert sorted(by_id) == sorted(GPUS_BY_SWITCH)
        sw = by_id["0000:3b:00.0"]
        assert sw.root_complex == "pci0000:3a"
        assert sw.root_port == "0000:3a:02.0"
        assert sw.parent_switch is None
        assert sw.numa_node == 0
        assert (sw.vendor_id, sw.device_id) == ("0x1000", "0xc030")
        assert len(sw.downstream_ports) == 4  # one slot empty
        assert by_id["0000:b1:00.0"].numa_node == 1

    @pytest.mark.parametrize(
        ("address", "numa"),
        [
            ("0000:1a:00.0", 0),
            ("0000:3e:00.0", 0),
            ("0000:9a:00.0", 1),
            ("0000:b4:00.0", 1),
            ("0000:1c:00.0", 0),
            ("0000:b5:00.0", 1),
            ("0000:5e:00.0", 0),
            ("0000:d8:00.0", 1),
            ("0000:01:00.0", 0),
        ],
    )
    def test_numa_of_each_device(self, address: str, numa: int) -> None:
        assert self.topology.numa_of(address) == numa

    def test_gpu_indices_follow_pci_order(self) -> None:
        gpus = self.topology.gpus
        assert [g.device_index for g in gpus] == list(range(8))
        assert [g.address for g in gpus] == sorted(
            (g.address for g in gpus), key=lambda a: int(a.split(":")[1], 16)
        )
        assert {g.resource_name for g in gpus} == {"nvidia.com/gpu"}

    def test_rdma_nics(self) -> None:
        rdma = [n for n in self.topology.nics if n.resource_name is not None]
        assert [(n.address, n.device_index, n.rdma_devices) for n in rdma] == [
            ("0000:1c:00.0", 0, ("mlx5_0",)),
            ("0000:3f:00.0", 1, ("mlx5_1",)),
            ("0000:9c:00.0", 2, ("mlx5_2",)),
            ("0000:b5:00.0", 3, ("mlx5_3",)),
        ]
        assert {n.resource_name for n in rdma} == {"rdma/hca"}
        assert rdma[0].net_devices == ("ibp28s0",)
        mgmt = self.topology.device("0000:01:00.0")
        assert (mgmt.resource_name, mgmt.device_index, mgmt.net_devices) == (None, None, ("eno1",))

    def test_devices_on_root_ports_belong_to_their_root_complex(self) -> None:
        nvme = self.topology.device("0000:5e:00.0")
        assert (nvme.switch, nvme.root_port, nvme.locality) == (None, "0000:5d:02.0", "pci0000:5d")
        vga = self.topology.device("0000:03:00.0")  # behind a PCIe-to-PCI bridge, no switch
        assert (vga.switch, vga.root_port, vga.locality) == (None, "0000:00:1c.5", "pci0000:00")

    def test_resource_names_are_configurable(self) -> None:
        sysfs, _ = roots(TWO_SOCKET)
        naming = ResourceNaming(gpu="example.com/gpu", rdma_nic="example.com/ib")
        pcie = read_pcie(sysfs, [0, 1], Notes(), naming)
        assert {d.resource_name for d in pcie.devices} == {
            None,
            "example.com/gpu",
            "example.com/ib",
        }


class TestVm:
    reading = read_fixture(VM)

    def test_single_numa_node(self) -> None:
        (node,) = self.reading.topology.numa_nodes
        assert (node.id, node.cpulist, node.memory_bytes, node.distances) == (
            0, "0-7", 32866300 * 1024, (10,),
        )  # fmt: skip

    def test_devices(self) -> None:
        topology = self.reading.topology
        assert topology.pcie.switches == ()
        assert [r.id for r in topology.pcie.root_complexes] == ["pci0000:00"]
        # numa_node is -1 everywhere: on a one-node machine that means node 0, silently
        assert {d.numa_node for d in topology.pcie.devices} == {0}
        (gpu,) = topology.gpus
        assert (gpu.address, gpu.device_index, gpu.switch, gpu.root_port) == (
            "0000:00:1e.0", 0, None, None,
        )  # fmt: skip
        (nic,) = topology.nics
        assert (nic.net_devices, nic.resource_name) == (("eth0",), None)  # virtio0/net/eth0
        assert len(topology.devices_of(DeviceClass.OTHER)) == 4

    def test_pressure(self) -> None:
        pressure = self.reading.pressure
        assert pressure is not None
        assert pressure.cpu is not None
        assert pressure.io is not None
        assert pressure.cpu.some.avg10 == 2.04
        assert pressure.cpu.some.total_us == 918273645
        assert pressure.io.full is not None
        assert pressure.io.full.avg60 == 0.10


class TestBroken:
    reading = read_fixture(BROKEN)

    def warned(self, *fragments: str) -> bool:
        return any(all(f in w for f in fragments) for w in self.reading.warnings)

    @pytest.mark.parametrize(
        "fragments",
        [
            pytest.param(("node1/cpulist", "not a cpulist"), id="cpulist"),
            pytest.param(("node1/meminfo", "missing"), id="meminfo"),
            pytest.param(("node1/distance", "not a distance row"), id="distance"),
            pytest.param(("0000:00:09.0", "dangling"), id="dangling-link"),
            pytest.param(("garbage", "not a PCI address"), id="stray-entry"),
            pytest.param(("0000:00:03.0/class", "missing"), id="class-missing"),
            pytest.param(("0000:00:03.0", "device skipped"), id="class-missing-skip"),
            pytest.param(("0000:00:04.0/class", "not a class code"), id="class-garbage"),
            pytest.param(("0000:00:04.0/vendor", "not a 16-bit id"), id="vendor-garbage"),
            pytest.param(("0000:00:05.0/numa_node", "NUMA node 7"), id="numa-out-of-range"),
            pytest.param(("0000:00:07.0/numa_node", "unreadable"), id="numa-unreadable"),
            pytest.param(("0000:40:00.0", "NUMA node unknown"), id="numa-unknown"),
            pytest.param(("pressure/cpu", "not a PSI line"), id="psi-garbage"),
        ],
    )
    def test_warns(self, fragments: tuple[str, ...]) -> None:
        assert self.warned(*fragments), self.reading.warnings

    def test_degrades_to_usable_values(self) -> None:
        topology = self.reading.topology
        node0, node1 = topology.numa_nodes
        assert (node0.cpu_count, node0.distances) == (4, (10, 21))
        assert (node1.cpus, node1.memory_bytes, node1.distances) == (frozenset(), 0, (20, 10))
        by_address = {d.address: d for d in topology.pcie.devices}
        assert sorted(by_address) == [
            "0000:00:05.0",  # NVMe with a bogus numa_node: kept, NUMA from its root complex
            "0000:00:06.0",  # RoCE NIC (Ethernet class, infiniband/ present)
            "0000:00:07.0",  # unassigned class -> other
            "0000:21:00.0",
            "0000:40:00.0",
        ]  # 00:06.2 is a virtual function; 00:03.0/00:04.0 have no usable class
        assert by_address["0000:00:05.0"].numa_node == 0
        assert by_address["0000:00:06.0"].resource_name == "rdma/hca"
        assert by_address["0000:00:07.0"].device_class is DeviceClass.OTHER
        assert by_address["0000:21:00.0"].numa_node == 1  # -1, inherited from its root port
        assert by_address["0000:40:00.0"].numa_node is None
        pressure = self.reading.pressure
        assert pressure is not None
        assert (pressure.cpu, pressure.io) == (None, None)
        assert pressure.memory is not None


def test_no_numa_directory_means_one_node_with_all_cpus() -> None:
    reading = read_fixture(NO_NUMA)
    (node,) = reading.topology.numa_nodes
    assert (node.id, node.cpulist, node.memory_bytes, node.distances) == (
        0, "0-3", 8000000 * 1024, (10,),
    )  # fmt: skip
    assert reading.topology.pcie.devices == ()
    assert reading.pressure is None
    assert any("no NUMA nodes" in w for w in reading.warnings)


def test_empty_roots_do_not_crash(tmp_path: Path) -> None:
    reading = read_node(sysfs_root=tmp_path / "sys", procfs_root=tmp_path / "proc")
    (node,) = reading.topology.numa_nodes
    assert node.cpus == frozenset()
    assert reading.warnings


def test_internal_errors_become_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*_: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr("scheduler.agent.reader.read_pcie", explode)
    reading = read_fixture(TWO_SOCKET)
    assert reading.topology.pcie.devices == ()
    assert reading.topology.cpu_count == 96
    assert any(
        w.startswith(f"{INTERNAL_ERROR} reading PCI: RuntimeError") for w in reading.warnings
    )


@pytest.mark.parametrize(
    ("class_code", "vendor", "expected"),
    [
        pytest.param(0x030200, "0x10de", DeviceClass.GPU, id="nvidia-3d"),
        pytest.param(0x030000, "0x10de", DeviceClass.GPU, id="nvidia-vga"),
        pytest.param(0x030000, "0x1a03", DeviceClass.OTHER, id="aspeed-vga"),
        pytest.param(0x030200, "0x1002", DeviceClass.OTHER, id="amd-3d"),
        pytest.param(0x040300, "0x10de", DeviceClass.OTHER, id="nvidia-hdmi-audio"),
        pytest.param(0x020000, "0x8086", DeviceClass.NIC, id="ethernet"),
        pytest.param(0x020700, "0x15b3", DeviceClass.NIC, id="infiniband"),
        pytest.param(0x028000, "0x8086", DeviceClass.OTHER, id="other-network"),
        pytest.param(0x010802, "0x144d", DeviceClass.NVME, id="nvme"),
        pytest.param(0x010601, "0x8086", DeviceClass.OTHER, id="sata"),
        pytest.param(0x060400, "0x1000", None, id="pci-bridge"),
        pytest.param(0x060000, "0x8086", None, id="host-bridge"),
        pytest.param(0x068000, "0x10de", None, id="nvswitch-bridge-other"),
        pytest.param(0x088000, "0x8086", None, id="system-peripheral"),
        pytest.param(0x110100, "0x8086", None, id="perf-counters"),
    ],
)
def test_classify(class_code: int, vendor: str, expected: DeviceClass | None) -> None:
    assert classify(class_code, vendor) is expected


def test_default_naming() -> None:
    assert (DEFAULT_NAMING.gpu, DEFAULT_NAMING.rdma_nic) == ("nvidia.com/gpu", "rdma/hca")


def test_this_machine() -> None:
    """Whatever this machine is, the agent reads it without crashing or internal errors."""
    reading = read_node()
    topology = reading.topology
    assert len(topology.numa_nodes) >= 1
    assert topology.cpu_count >= 1
    assert topology.memory_bytes > 0
    assert not [w for w in reading.warnings if w.startswith(INTERNAL_ERROR)]
    assert NodeTopology.from_spec(topology.to_spec()) == topology

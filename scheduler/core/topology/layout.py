"""A node's topology compiled into the arrays the device choice works on.

Two sources give the same shape: a Lattice ``NodeTopology`` (NUMA nodes, the PCIe tree and
device identities) and, for nodes without one, a ``NodeResourceTopology`` (NUMA zones and
how many devices each holds, nothing below). Devices become *slots*: GPU slot ``i`` has a
NUMA zone position, a PCIe group (its switch; -1 when it hangs off a root port or nothing
is known) and, from a NodeTopology, its device index and PCI address. Pair costs are the
model's :meth:`NodeTopology.distance` (10 per PCIe link level, SLIT excess across sockets);
a NUMA-only source charges 40 (the NODE level: same NUMA node, path unknown) within a zone
and the SYS level plus SLIT excess across zones, so both sources rank choices alike.

Layouts are immutable and interned by source equality, so identical nodes share one layout
and the choice cache can key on its identity.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

import numpy as np

from scheduler.core.snapshot import IntArray
from scheduler.model.names import CPU
from scheduler.model.noderesourcetopology import NodeResourceTopology
from scheduler.model.topology import (
    LOCAL_NUMA_DISTANCE,
    CpuManagerPolicy,
    DeviceClass,
    NodeTopology,
    PcieLink,
    TopologyManagerPolicy,
)

SAME_NUMA_COST: Final = int(PcieLink.NODE) * 10
CROSS_NUMA_COST: Final = int(PcieLink.SYS) * 10


class Source(enum.StrEnum):
    NODE_TOPOLOGY = "NodeTopology"
    NODE_RESOURCE_TOPOLOGY = "NodeResourceTopology"


@dataclass(frozen=True, eq=False)
class NodeLayout:
    source: Source
    numa_ids: tuple[int, ...]
    numa_cpus: IntArray
    """Whole CPUs per zone; from a NodeResourceTopology already net of kubelet reservations."""
    cpus_net_of_reserved: bool
    gpu_index: tuple[int | None, ...]
    """Device index per GPU slot (``nvidia-smi`` index); None when the source does not say."""
    gpu_zone: IntArray
    """Zone position per GPU slot; -1 when the NUMA node is unknown."""
    gpu_group: IntArray
    """PCIe switch id per GPU slot; -1 when on no switch (or unknown)."""
    nic_address: tuple[str | None, ...]
    nic_zone: IntArray
    nic_group: IntArray
    gpu_cost: IntArray
    """(GPUs, GPUs) pair cost."""
    nic_cost: IntArray
    """(NICs, GPUs) pair cost."""
    num_groups: int
    policy: TopologyManagerPolicy | None
    pins_cpus: bool
    """The kubelet pins whole CPUs of Guaranteed pods (static CPU manager)."""
    available_gpus: IntArray | None = None
    """Per zone, what a NodeResourceTopology says is still free (None for NodeTopology)."""
    available_nics: IntArray | None = None
    available_cpus: IntArray | None = None

    @property
    def num_gpus(self) -> int:
        return len(self.gpu_index)

    @property
    def num_nics(self) -> int:
        return len(self.nic_address)

    @property
    def num_zones(self) -> int:
        return len(self.numa_ids)

    @property
    def single_numa(self) -> bool:
        return self.policy is TopologyManagerPolicy.SINGLE_NUMA_NODE

    @property
    def restricted(self) -> bool:
        return self.policy is TopologyManagerPolicy.RESTRICTED

    @property
    def pcie_known(self) -> bool:
        return self.source is Source.NODE_TOPOLOGY

    def zone_position(self, numa_id: int) -> int | None:
        try:
            return self.numa_ids.index(numa_id)
        except ValueError:
            return None

    def zone_gpus(self) -> IntArray:
        return _counts(self.gpu_zone, self.num_zones)

    def zone_nics(self) -> IntArray:
        return _counts(self.nic_zone, self.num_zones)

    def group_gpus(self) -> IntArray:
        return _counts(self.gpu_group, self.num_groups)


def _counts(positions: IntArray, size: int) -> IntArray:
    known = positions[positions >= 0]
    counts: IntArray = np.bincount(known, minlength=size).astype(np.int64)
    return counts


def _ints(values: list[int]) -> IntArray:
    return np.asarray(values, dtype=np.int64).reshape(len(values))


def from_node_topology(topology: NodeTopology, gpu_resource: str, rdma_resource: str) -> NodeLayout:
    numa_ids = tuple(n.id for n in topology.numa_nodes)
    zone_of = {numa_id: i for i, numa_id in enumerate(numa_ids)}
    gpus = sorted(
        (
            d
            for d in topology.devices_of(DeviceClass.GPU)
            if d.resource_name == gpu_resource and d.device_index is not None
        ),
        key=lambda d: d.device_index or 0,
    )
    nics = sorted(
        (
            d
            for d in topology.devices_of(DeviceClass.NIC)
            if d.resource_name == rdma_resource and d.device_index is not None
        ),
        key=lambda d: d.device_index or 0,
    )
    switch_ids: dict[str, int] = {}
    for d in (*gpus, *nics):
        if d.switch is not None:
            switch_ids.setdefault(d.switch, len(switch_ids))

    def group(switch: str | None) -> int:
        return -1 if switch is None else switch_ids[switch]

    def zone(numa: int | None) -> int:
        return -1 if numa is None else zone_of.get(numa, -1)

    gpu_cost = np.array(
        [[topology.distance(a.address, b.address) for b in gpus] for a in gpus], dtype=np.int64
    ).reshape(len(gpus), len(gpus))
    nic_cost = np.array(
        [[topology.distance(n.address, g.address) for g in gpus] for n in nics], dtype=np.int64
    ).reshape(len(nics), len(gpus))
    hints = topology.kubelet
    return NodeLayout(
        source=Source.NODE_TOPOLOGY,
        numa_ids=numa_ids,
        numa_cpus=_ints([n.cpu_count for n in topology.numa_nodes]),
        cpus_net_of_reserved=False,
        gpu_index=tuple(d.device_index for d in gpus),
        gpu_zone=_ints([zone(d.numa_node) for d in gpus]),
        gpu_group=_ints([group(d.switch) for d in gpus]),
        nic_address=tuple(d.address for d in nics),
        nic_zone=_ints([zone(d.numa_node) for d in nics]),
        nic_group=_ints([group(d.switch) for d in nics]),
        gpu_cost=gpu_cost,
        nic_cost=nic_cost,
        num_groups=len(switch_ids),
        policy=hints.topology_manager_policy if hints is not None else None,
        pins_cpus=hints is not None and hints.cpu_manager_policy is CpuManagerPolicy.STATIC,
    )


def from_node_resource_topology(
    nrt: NodeResourceTopology, gpu_resource: str, rdma_resource: str
) -> NodeLayout:
    zones = nrt.zones
    distances = nrt.distances()

    def slots(resource: str) -> list[int]:
        return [z for z, zone in enumerate(zones) for _ in range(zone.allocatable(resource))]

    def cost(a: int, b: int) -> int:
        if a == b:
            return SAME_NUMA_COST
        return CROSS_NUMA_COST + max(distances[a][b] - LOCAL_NUMA_DISTANCE, 0)

    gpu_zones, nic_zones = slots(gpu_resource), slots(rdma_resource)
    return NodeLayout(
        source=Source.NODE_RESOURCE_TOPOLOGY,
        numa_ids=nrt.numa_ids,
        numa_cpus=_ints([z.allocatable(CPU) // 1000 for z in zones]),
        cpus_net_of_reserved=True,
        gpu_index=tuple(None for _ in gpu_zones),
        gpu_zone=_ints(gpu_zones),
        gpu_group=_ints([-1] * len(gpu_zones)),
        nic_address=tuple(None for _ in nic_zones),
        nic_zone=_ints(nic_zones),
        nic_group=_ints([-1] * len(nic_zones)),
        gpu_cost=np.array(
            [[cost(a, b) for b in gpu_zones] for a in gpu_zones], dtype=np.int64
        ).reshape(len(gpu_zones), len(gpu_zones)),
        nic_cost=np.array(
            [[cost(n, g) for g in gpu_zones] for n in nic_zones], dtype=np.int64
        ).reshape(len(nic_zones), len(gpu_zones)),
        num_groups=0,
        policy=nrt.topology_manager_policy,
        # Exporters report per-zone CPUs for exactly the pods a static CPU manager pins.
        pins_cpus=nrt.topology_manager_policy is TopologyManagerPolicy.SINGLE_NUMA_NODE,
        available_gpus=_ints([z.available(gpu_resource) for z in zones]),
        available_nics=_ints([z.available(rdma_resource) for z in zones]),
        available_cpus=_ints([z.available(CPU) // 1000 for z in zones]),
    )

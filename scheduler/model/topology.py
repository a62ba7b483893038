"""Node hardware topology: NUMA nodes, the PCIe tree and where each device sits in it.

The node agent builds a :class:`NodeTopology` from sysfs and publishes it as the spec of a
``NodeTopology`` custom resource (``lattice.dev/v1alpha1``, one per node, same name as the
node); the scheduler parses it back with :meth:`NodeTopology.from_spec`. Both directions live
here so the wire format has exactly one definition, and ``from_spec(to_spec(t)) == t`` holds
(tested).

Theory of operation
-------------------
* A NUMA node is a set of CPUs, an amount of memory and a row of the firmware's (SLIT)
  distance matrix. ``distances`` is aligned with the NUMA nodes sorted by id, not indexed by
  id: node ids may have gaps (0 and 2), the matrix never does.
* The PCIe tree is kept as three flat lists. *Root complexes* are the host bridges
  (``pci0000:3a``). *Switches* are identified by their upstream port's address; a device's
  ``switch`` is the innermost switch above it, ``parent_switch`` gives cascades. A device
  plugged straight into a root port has no switch and belongs to its root complex.
* Locality between two devices is reported as a :class:`PcieLink` level in the manner of
  ``nvidia-smi topo -m`` (PIX < PXB < PHB < NODE < SYS) and as an integer cost
  (:meth:`NodeTopology.distance`) that folds in the SLIT distance for cross-NUMA pairs, so a
  scorer can sum pairwise costs with exact integer arithmetic.
* GPUs and RDMA NICs carry the extended resource name a device plugin exposes them under and
  an index: the rank of the device's PCI address among the devices of that resource on the
  node. NVML (and so the NVIDIA device plugin and ``nvidia-smi``) numbers GPUs in PCI bus
  order, so GPU index ``i`` here is ``nvidia-smi`` GPU ``i``.

Everything here is pure data: no I/O, no Kubernetes client.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, Final, NotRequired, TypedDict

GROUP: Final = "lattice.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "NodeTopology"
PLURAL: Final = "nodetopologies"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "lattice-agent"
"""The agent labels what it publishes, so a cleanup deletes its objects and nobody else's."""

GPU_RESOURCE: Final = "nvidia.com/gpu"
"""Default resource name of NVIDIA GPUs (the NVIDIA device plugin's)."""
RDMA_RESOURCE: Final = "rdma/hca"
"""Default resource name of RDMA-capable NICs (the RDMA shared device plugin's prefix)."""

LOCAL_NUMA_DISTANCE: Final = 10
"""SLIT distance of a node to itself; remote distances are relative to it."""

_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_ROOT_COMPLEX = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")
_HEX_ID = re.compile(r"^0x[0-9a-f]{4}$")
_CLASS_CODE = re.compile(r"^0x[0-9a-f]{6}$")
_CPULIST = re.compile(r"^(\d+(-\d+)?)(,\d+(-\d+)?)*$")


class TopologyParseError(ValueError):
    """A NodeTopology spec or status that does not follow the schema."""


class DeviceClass(enum.StrEnum):
    GPU = "gpu"
    NIC = "nic"
    NVME = "nvme"
    OTHER = "other"


class PcieLink(enum.IntEnum):
    """How far apart two devices are, ordered nearest first (``nvidia-smi topo`` names)."""

    SAME = 0
    """The same device."""
    PIX = 1
    """Both below the same PCIe switch: peer traffic never leaves the switch."""
    PXB = 2
    """Below a shared switch cascade or root port, crossing more than one switch."""
    PHB = 3
    """Same root complex (host bridge): traffic goes through the CPU's PCIe root."""
    NODE = 4
    """Different root complexes of the same NUMA node."""
    SYS = 5
    """Different NUMA nodes: traffic crosses the inter-socket link (UPI/xGMI)."""


class TopologyManagerPolicy(enum.StrEnum):
    NONE = "none"
    BEST_EFFORT = "best-effort"
    RESTRICTED = "restricted"
    SINGLE_NUMA_NODE = "single-numa-node"


class TopologyManagerScope(enum.StrEnum):
    CONTAINER = "container"
    POD = "pod"


class CpuManagerPolicy(enum.StrEnum):
    NONE = "none"
    STATIC = "static"


class MemoryManagerPolicy(enum.StrEnum):
    NONE = "None"
    STATIC = "Static"


# --- wire format (camelCase, as stored in the API) ------------------------------------------


class NumaNodeSpec(TypedDict):
    id: int
    cpus: str
    cpuCount: int
    memoryBytes: int
    distances: list[int]


class RootComplexSpec(TypedDict):
    id: str
    numaNode: NotRequired[int]


class SwitchSpec(TypedDict):
    id: str
    rootComplex: str
    vendorId: str
    deviceId: str
    downstreamPorts: list[str]
    rootPort: NotRequired[str]
    parentSwitch: NotRequired[str]
    numaNode: NotRequired[int]


DeviceSpec = TypedDict(
    "DeviceSpec",
    {
        "address": str,
        "class": str,
        "classCode": str,
        "vendorId": str,
        "deviceId": str,
        "rootComplex": str,
        "numaNode": NotRequired[int],
        "rootPort": NotRequired[str],
        "switch": NotRequired[str],
        "resourceName": NotRequired[str],
        "deviceIndex": NotRequired[int],
        "netDevices": NotRequired[list[str]],
        "rdmaDevices": NotRequired[list[str]],
    },
)


class PcieSpec(TypedDict):
    rootComplexes: list[RootComplexSpec]
    switches: list[SwitchSpec]
    devices: list[DeviceSpec]


class KubeletSpec(TypedDict, total=False):
    topologyManagerPolicy: str
    topologyManagerScope: str
    cpuManagerPolicy: str
    memoryManagerPolicy: str


class SummarySpec(TypedDict):
    numaNodes: int
    cpus: int
    memoryBytes: int
    gpus: int
    nics: int
    switches: int


class NodeTopologySpec(TypedDict):
    summary: SummarySpec
    numaNodes: list[NumaNodeSpec]
    pcie: PcieSpec
    kubelet: NotRequired[KubeletSpec]


class PressureLineSpec(TypedDict):
    avg10: float
    avg60: float
    avg300: float
    totalMicroseconds: int


class PressureSpec(TypedDict):
    some: PressureLineSpec
    full: NotRequired[PressureLineSpec]


class PressureReadingsSpec(TypedDict, total=False):
    cpu: PressureSpec
    memory: PressureSpec
    io: PressureSpec


class CpuLoadSpec(TypedDict):
    usedMillicores: int
    capacityMillicores: int
    peakMillicores: NotRequired[int]


class MemoryLoadSpec(TypedDict):
    usedBytes: int
    capacityBytes: int


class NodeLoadSpec(TypedDict):
    sampleTime: str
    windowSeconds: float
    samples: int
    cpu: CpuLoadSpec
    memory: MemoryLoadSpec
    cpuPercent: int
    memoryPercent: int


class NodeTopologyStatusSpec(TypedDict):
    lastReportTime: str
    pressure: NotRequired[PressureReadingsSpec]
    load: NotRequired[NodeLoadSpec]
    warnings: NotRequired[list[str]]


# --- cpulists --------------------------------------------------------------------------------


def parse_cpulist(text: str) -> frozenset[int]:
    """Parse the kernel's list format (``0-23,48-71``); the empty string is no CPUs."""
    text = text.strip()
    if not text:
        return frozenset()
    if not _CPULIST.match(text):
        raise ValueError(f"not a cpulist: {text!r}")
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        lo = int(first)
        hi = int(last) if last else lo
        if hi < lo:
            raise ValueError(f"descending range {part!r} in cpulist {text!r}")
        cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """The canonical kernel list form, so equal sets always serialise equally."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        ranges.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(ranges)


def pci_sort_key(address: str) -> tuple[int, int, int, int]:
    """Numeric (domain, bus, device, function): the order the kernel and NVML enumerate in."""
    domain, bus, devfn = address.split(":")
    dev, fn = devfn.split(".")
    return int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16)


def is_pci_address(text: str) -> bool:
    return bool(_PCI_ADDRESS.match(text))


def is_root_complex_id(text: str) -> bool:
    return bool(_ROOT_COMPLEX.match(text))


# --- records ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NumaNode:
    id: int
    cpus: frozenset[int]
    memory_bytes: int
    distances: tuple[int, ...]
    """SLIT row, aligned with the topology's NUMA nodes sorted by id."""

    @property
    def cpu_count(self) -> int:
        return len(self.cpus)

    @property
    def cpulist(self) -> str:
        return format_cpulist(self.cpus)


@dataclass(frozen=True, slots=True)
class RootComplex:
    id: str
    """The host bridge's sysfs name, e.g. ``pci0000:3a``."""
    numa_node: int | None = None


@dataclass(frozen=True, slots=True)
class PcieSwitch:
    id: str
    """Address of the switch's upstream port: the one stable name the switch has."""
    root_complex: str
    vendor_id: str
    device_id: str
    downstream_ports: tuple[str, ...] = ()
    root_port: str | None = None
    parent_switch: str | None = None
    """The next switch up, for cascaded switches."""
    numa_node: int | None = None


@dataclass(frozen=True, slots=True)
class PciDevice:
    address: str
    device_class: DeviceClass
    class_code: str
    vendor_id: str
    device_id: str
    root_complex: str
    numa_node: int | None = None
    """``None`` when the kernel does not know (``numa_node`` of -1 on a multi-socket host)."""
    root_port: str | None = None
    switch: str | None = None
    """Innermost switch above the device (its upstream port address)."""
    resource_name: str | None = None
    device_index: int | None = None
    net_devices: tuple[str, ...] = ()
    rdma_devices: tuple[str, ...] = ()

    @property
    def locality(self) -> str:
        """Switch if there is one, else the root complex: the group devices are placed by."""
        return self.switch if self.switch is not None else self.root_complex


@dataclass(frozen=True, slots=True)
class PcieTopology:
    root_complexes: tuple[RootComplex, ...] = ()
    switches: tuple[PcieSwitch, ...] = ()
    devices: tuple[PciDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class KubeletHints:
    """Kubelet resource-manager policies, when the agent could read the kubelet config."""

    topology_manager_policy: TopologyManagerPolicy | None = None
    topology_manager_scope: TopologyManagerScope | None = None
    cpu_manager_policy: CpuManagerPolicy | None = None
    memory_manager_policy: MemoryManagerPolicy | None = None


@dataclass(frozen=True)
class NodeTopology:
    """The hardware of one node; the spec of its NodeTopology object."""

    numa_nodes: tuple[NumaNode, ...]
    pcie: PcieTopology = field(default_factory=PcieTopology)
    kubelet: KubeletHints | None = None

    def __post_init__(self) -> None:
        ids = [n.id for n in self.numa_nodes]
        if not ids:
            raise ValueError("a node has at least one NUMA node")
        if ids != sorted(set(ids)):
            raise ValueError(f"NUMA nodes must be sorted by id without duplicates: {ids}")
        for n in self.numa_nodes:
            if len(n.distances) != len(ids):
                raise ValueError(
                    f"NUMA node {n.id} has {len(n.distances)} distances for {len(ids)} nodes"
                )

    # -- queries the scheduler uses ----------------------------------------------------------

    @cached_property
    def _numa_index(self) -> dict[int, int]:
        return {n.id: i for i, n in enumerate(self.numa_nodes)}

    @cached_property
    def _devices(self) -> dict[str, PciDevice]:
        return {d.address: d for d in self.pcie.devices}

    @cached_property
    def _switches(self) -> dict[str, PcieSwitch]:
        return {s.id: s for s in self.pcie.switches}

    @property
    def cpu_count(self) -> int:
        return sum(n.cpu_count for n in self.numa_nodes)

    @property
    def memory_bytes(self) -> int:
        return sum(n.memory_bytes for n in self.numa_nodes)

    def numa_node(self, numa_id: int) -> NumaNode:
        return self.numa_nodes[self._numa_index[numa_id]]

    def devices_of(self, device_class: DeviceClass) -> tuple[PciDevice, ...]:
        return tuple(d for d in self.pcie.devices if d.device_class is device_class)

    @property
    def gpus(self) -> tuple[PciDevice, ...]:
        return self.devices_of(DeviceClass.GPU)

    @property
    def nics(self) -> tuple[PciDevice, ...]:
        return self.devices_of(DeviceClass.NIC)

    def device(self, address: str) -> PciDevice:
        return self._devices[address]

    def numa_of(self, address: str) -> int | None:
        return self._devices[address].numa_node

    def by_locality(self, device_class: DeviceClass) -> dict[str, tuple[PciDevice, ...]]:
        """Devices of a class keyed by switch (or root complex when on a root port)."""
        groups: dict[str, list[PciDevice]] = {}
        for d in self.devices_of(device_class):
            groups.setdefault(d.locality, []).append(d)
        return {k: tuple(v) for k, v in sorted(groups.items())}

    def gpus_by_switch(self) -> dict[str, tuple[PciDevice, ...]]:
        return self.by_locality(DeviceClass.GPU)

    def numa_distance(self, a: int, b: int) -> int:
        """SLIT distance between two NUMA node ids (10 = local)."""
        return self.numa_nodes[self._numa_index[a]].distances[self._numa_index[b]]

    def _switch_chain(self, device: PciDevice) -> list[str]:
        chain: list[str] = []
        current = device.switch
        while current is not None and current not in chain:
            chain.append(current)
            sw = self._switches.get(current)
            current = sw.parent_switch if sw is not None else None
        return chain

    def link(self, a: str, b: str) -> PcieLink:
        """The nearest path class between two devices, by PCI address."""
        da, db = self._devices[a], self._devices[b]
        if a == b:
            return PcieLink.SAME
        if da.switch is not None and da.switch == db.switch:
            return PcieLink.PIX
        if set(self._switch_chain(da)) & set(self._switch_chain(db)) or (
            da.root_port is not None and da.root_port == db.root_port
        ):
            return PcieLink.PXB
        if da.root_complex == db.root_complex:
            return PcieLink.PHB
        if da.numa_node is not None and da.numa_node == db.numa_node:
            return PcieLink.NODE
        return PcieLink.SYS

    def distance(self, a: str, b: str) -> int:
        """Integer cost of a device pair: 10 per link level, and for SYS the SLIT excess.

        SAME 0, PIX 10, PXB 20, PHB 30, NODE 40, SYS 50 + (SLIT - 10): 61 across one socket
        hop at the common SLIT 21. A pair whose NUMA node is unknown is charged the worst
        distance in the matrix, so unknown locality never looks better than known.
        """
        level = self.link(a, b)
        if level is not PcieLink.SYS:
            return int(level) * 10
        na, nb = self._devices[a].numa_node, self._devices[b].numa_node
        if na is None or nb is None or na not in self._numa_index or nb not in self._numa_index:
            slit = max(d for n in self.numa_nodes for d in n.distances)
        else:
            slit = self.numa_distance(na, nb)
        return int(PcieLink.SYS) * 10 + max(slit - LOCAL_NUMA_DISTANCE, 0)

    # -- wire format -------------------------------------------------------------------------

    def to_spec(self) -> NodeTopologySpec:
        spec: NodeTopologySpec = {
            "summary": {
                "numaNodes": len(self.numa_nodes),
                "cpus": self.cpu_count,
                "memoryBytes": self.memory_bytes,
                "gpus": len(self.gpus),
                "nics": len(self.nics),
                "switches": len(self.pcie.switches),
            },
            "numaNodes": [_numa_to_spec(n) for n in self.numa_nodes],
            "pcie": {
                "rootComplexes": [_root_complex_to_spec(r) for r in self.pcie.root_complexes],
                "switches": [_switch_to_spec(s) for s in self.pcie.switches],
                "devices": [_device_to_spec(d) for d in self.pcie.devices],
            },
        }
        if self.kubelet is not None:
            spec["kubelet"] = _kubelet_to_spec(self.kubelet)
        return spec

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> NodeTopology:
        """Parse a spec as stored in the API; the summary is derived, so it is not read."""
        try:
            numa = tuple(_numa_from_spec(n) for n in _list(spec, "numaNodes"))
            pcie = _mapping(spec, "pcie")
            topology = cls(
                numa_nodes=numa,
                pcie=PcieTopology(
                    root_complexes=tuple(
                        _root_complex_from_spec(r) for r in _list(pcie, "rootComplexes")
                    ),
                    switches=tuple(_switch_from_spec(s) for s in _list(pcie, "switches")),
                    devices=tuple(_device_from_spec(d) for d in _list(pcie, "devices")),
                ),
                kubelet=_kubelet_from_spec(spec["kubelet"]) if "kubelet" in spec else None,
            )
        except TopologyParseError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise TopologyParseError(f"invalid NodeTopology spec: {exc}") from exc
        return topology


# --- status ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PressureLine:
    """One PSI line: share of wall time stalled (percent) over 10/60/300 s, and the total."""

    avg10: float
    avg60: float
    avg300: float
    total_us: int


@dataclass(frozen=True, slots=True)
class Pressure:
    some: PressureLine
    full: PressureLine | None = None


@dataclass(frozen=True, slots=True)
class PressureReadings:
    cpu: Pressure | None = None
    memory: Pressure | None = None
    io: Pressure | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeLoad:
    """Measured use of a whole node over the agent's last report window.

    Absolute units (millicores, bytes) with the capacity they were measured against, so the
    scheduler can add the requests of pods it just placed. CPU is the mean over the window
    (busy jiffies of all online CPUs), memory the last sample (MemTotal - MemAvailable): a
    mean would hide growth that ends in an OOM kill. ``sample_time`` is when the window
    ended, with sub-second precision so consecutive reports never collide.
    """

    sample_time: datetime
    window_seconds: float
    samples: int
    cpu_used_milli: int
    cpu_capacity_milli: int
    mem_used_bytes: int
    mem_capacity_bytes: int
    cpu_peak_milli: int | None = None
    """Highest single sample in the window, when more than one sample was taken."""

    def __post_init__(self) -> None:
        if self.sample_time.tzinfo is None:
            raise ValueError("sample_time must be timezone-aware")
        if self.cpu_capacity_milli <= 0 or self.mem_capacity_bytes <= 0:
            raise ValueError("load capacities must be positive")
        if min(self.cpu_used_milli, self.mem_used_bytes, self.samples) < 0:
            raise ValueError("load figures must not be negative")
        if not self.window_seconds >= 0:
            raise ValueError("window_seconds must be >= 0")

    @property
    def cpu_fraction(self) -> float:
        return self.cpu_used_milli / self.cpu_capacity_milli

    @property
    def memory_fraction(self) -> float:
        return self.mem_used_bytes / self.mem_capacity_bytes

    def to_spec(self) -> NodeLoadSpec:
        cpu: CpuLoadSpec = {
            "usedMillicores": self.cpu_used_milli,
            "capacityMillicores": self.cpu_capacity_milli,
        }
        if self.cpu_peak_milli is not None:
            cpu["peakMillicores"] = self.cpu_peak_milli
        return {
            "sampleTime": format_micro_time(self.sample_time),
            "windowSeconds": round(float(self.window_seconds), 3),
            "samples": self.samples,
            "cpu": cpu,
            "memory": {"usedBytes": self.mem_used_bytes, "capacityBytes": self.mem_capacity_bytes},
            "cpuPercent": round(100 * self.cpu_fraction),
            "memoryPercent": round(100 * self.memory_fraction),
        }

    @classmethod
    def from_spec(cls, raw: Any) -> NodeLoad:
        """Parse ``status.load``; the percentages are derived, so they are not read back."""
        try:
            m = _as_mapping(raw, "load")
            cpu = _mapping(m, "cpu")
            mem = _mapping(m, "memory")
            return cls(
                sample_time=parse_time(_str(m, "sampleTime")),
                window_seconds=_float(m, "windowSeconds"),
                samples=_int(m, "samples"),
                cpu_used_milli=_int(cpu, "usedMillicores"),
                cpu_capacity_milli=_int(cpu, "capacityMillicores"),
                cpu_peak_milli=_opt_int(cpu, "peakMillicores"),
                mem_used_bytes=_int(mem, "usedBytes"),
                mem_capacity_bytes=_int(mem, "capacityBytes"),
            )
        except TopologyParseError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise TopologyParseError(f"invalid NodeTopology status.load: {exc}") from exc


@dataclass(frozen=True, slots=True)
class NodeTopologyStatus:
    """What the agent observed at its last report; the heartbeat the scheduler ages."""

    last_report_time: datetime
    pressure: PressureReadings | None = None
    warnings: tuple[str, ...] = ()
    load: NodeLoad | None = None

    def to_status(self) -> NodeTopologyStatusSpec:
        out: NodeTopologyStatusSpec = {"lastReportTime": format_time(self.last_report_time)}
        if self.pressure is not None:
            readings: PressureReadingsSpec = {}
            if self.pressure.cpu is not None:
                readings["cpu"] = _pressure_to_spec(self.pressure.cpu)
            if self.pressure.memory is not None:
                readings["memory"] = _pressure_to_spec(self.pressure.memory)
            if self.pressure.io is not None:
                readings["io"] = _pressure_to_spec(self.pressure.io)
            out["pressure"] = readings
        if self.load is not None:
            out["load"] = self.load.to_spec()
        if self.warnings:
            out["warnings"] = list(self.warnings)
        return out

    @classmethod
    def from_status(cls, status: Mapping[str, Any]) -> NodeTopologyStatus:
        try:
            pressure = None
            if "pressure" in status:
                p = _mapping(status, "pressure")
                pressure = PressureReadings(
                    cpu=_pressure_from_spec(p["cpu"]) if "cpu" in p else None,
                    memory=_pressure_from_spec(p["memory"]) if "memory" in p else None,
                    io=_pressure_from_spec(p["io"]) if "io" in p else None,
                )
            return cls(
                last_report_time=parse_time(_str(status, "lastReportTime")),
                pressure=pressure,
                warnings=tuple(_str_list(status, "warnings")),
                load=NodeLoad.from_spec(status["load"]) if "load" in status else None,
            )
        except TopologyParseError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise TopologyParseError(f"invalid NodeTopology status: {exc}") from exc


def format_time(t: datetime) -> str:
    """RFC 3339 in UTC with a ``Z``, seconds precision: what ``metav1.Time`` writes."""
    if t.tzinfo is None:
        raise ValueError("report times must be timezone-aware")
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(t: datetime) -> str:
    """RFC 3339 in UTC with microseconds, as ``metav1.MicroTime`` writes."""
    if t.tzinfo is None:
        raise ValueError("sample times must be timezone-aware")
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if t.tzinfo is None:
        raise ValueError(f"time without zone: {text!r}")
    return t.astimezone(UTC)


# --- (de)serialisation helpers ---------------------------------------------------------------


def _numa_to_spec(n: NumaNode) -> NumaNodeSpec:
    return {
        "id": n.id,
        "cpus": n.cpulist,
        "cpuCount": n.cpu_count,
        "memoryBytes": n.memory_bytes,
        "distances": list(n.distances),
    }


def _numa_from_spec(raw: Any) -> NumaNode:
    m = _as_mapping(raw, "numaNodes[]")
    cpus = parse_cpulist(_str(m, "cpus"))
    count = _int(m, "cpuCount")
    if count != len(cpus):
        raise TopologyParseError(f"cpuCount {count} disagrees with cpus {m['cpus']!r}")
    return NumaNode(
        id=_int(m, "id"),
        cpus=cpus,
        memory_bytes=_int(m, "memoryBytes"),
        distances=tuple(_int_list(m, "distances")),
    )


def _root_complex_to_spec(r: RootComplex) -> RootComplexSpec:
    out: RootComplexSpec = {"id": r.id}
    if r.numa_node is not None:
        out["numaNode"] = r.numa_node
    return out


def _root_complex_from_spec(raw: Any) -> RootComplex:
    m = _as_mapping(raw, "rootComplexes[]")
    return RootComplex(id=_str(m, "id"), numa_node=_opt_int(m, "numaNode"))


def _switch_to_spec(s: PcieSwitch) -> SwitchSpec:
    out: SwitchSpec = {
        "id": s.id,
        "rootComplex": s.root_complex,
        "vendorId": s.vendor_id,
        "deviceId": s.device_id,
        "downstreamPorts": list(s.downstream_ports),
    }
    if s.root_port is not None:
        out["rootPort"] = s.root_port
    if s.parent_switch is not None:
        out["parentSwitch"] = s.parent_switch
    if s.numa_node is not None:
        out["numaNode"] = s.numa_node
    return out


def _switch_from_spec(raw: Any) -> PcieSwitch:
    m = _as_mapping(raw, "switches[]")
    return PcieSwitch(
        id=_str(m, "id"),
        root_complex=_str(m, "rootComplex"),
        vendor_id=_str(m, "vendorId"),
        device_id=_str(m, "deviceId"),
        downstream_ports=tuple(_str_list(m, "downstreamPorts")),
        root_port=_opt_str(m, "rootPort"),
        parent_switch=_opt_str(m, "parentSwitch"),
        numa_node=_opt_int(m, "numaNode"),
    )


def _device_to_spec(d: PciDevice) -> DeviceSpec:
    out: DeviceSpec = {
        "address": d.address,
        "class": d.device_class.value,
        "classCode": d.class_code,
        "vendorId": d.vendor_id,
        "deviceId": d.device_id,
        "rootComplex": d.root_complex,
    }
    if d.numa_node is not None:
        out["numaNode"] = d.numa_node
    if d.root_port is not None:
        out["rootPort"] = d.root_port
    if d.switch is not None:
        out["switch"] = d.switch
    if d.resource_name is not None:
        out["resourceName"] = d.resource_name
    if d.device_index is not None:
        out["deviceIndex"] = d.device_index
    if d.net_devices:
        out["netDevices"] = list(d.net_devices)
    if d.rdma_devices:
        out["rdmaDevices"] = list(d.rdma_devices)
    return out


def _device_from_spec(raw: Any) -> PciDevice:
    m = _as_mapping(raw, "devices[]")
    return PciDevice(
        address=_str(m, "address"),
        device_class=DeviceClass(_str(m, "class")),
        class_code=_str(m, "classCode"),
        vendor_id=_str(m, "vendorId"),
        device_id=_str(m, "deviceId"),
        root_complex=_str(m, "rootComplex"),
        numa_node=_opt_int(m, "numaNode"),
        root_port=_opt_str(m, "rootPort"),
        switch=_opt_str(m, "switch"),
        resource_name=_opt_str(m, "resourceName"),
        device_index=_opt_int(m, "deviceIndex"),
        net_devices=tuple(_str_list(m, "netDevices")),
        rdma_devices=tuple(_str_list(m, "rdmaDevices")),
    )


def _kubelet_to_spec(k: KubeletHints) -> KubeletSpec:
    out: KubeletSpec = {}
    if k.topology_manager_policy is not None:
        out["topologyManagerPolicy"] = k.topology_manager_policy.value
    if k.topology_manager_scope is not None:
        out["topologyManagerScope"] = k.topology_manager_scope.value
    if k.cpu_manager_policy is not None:
        out["cpuManagerPolicy"] = k.cpu_manager_policy.value
    if k.memory_manager_policy is not None:
        out["memoryManagerPolicy"] = k.memory_manager_policy.value
    return out


def _kubelet_from_spec(raw: Any) -> KubeletHints:
    m = _as_mapping(raw, "kubelet")
    tmp, tms = _opt_str(m, "topologyManagerPolicy"), _opt_str(m, "topologyManagerScope")
    cmp_, mmp = _opt_str(m, "cpuManagerPolicy"), _opt_str(m, "memoryManagerPolicy")
    return KubeletHints(
        topology_manager_policy=TopologyManagerPolicy(tmp) if tmp is not None else None,
        topology_manager_scope=TopologyManagerScope(tms) if tms is not None else None,
        cpu_manager_policy=CpuManagerPolicy(cmp_) if cmp_ is not None else None,
        memory_manager_policy=MemoryManagerPolicy(mmp) if mmp is not None else None,
    )


def _pressure_line_to_spec(p: PressureLine) -> PressureLineSpec:
    return {"avg10": p.avg10, "avg60": p.avg60, "avg300": p.avg300, "totalMicroseconds": p.total_us}


def _pressure_to_spec(p: Pressure) -> PressureSpec:
    out: PressureSpec = {"some": _pressure_line_to_spec(p.some)}
    if p.full is not None:
        out["full"] = _pressure_line_to_spec(p.full)
    return out


def _pressure_line_from_spec(raw: Any) -> PressureLine:
    m = _as_mapping(raw, "pressure line")
    return PressureLine(
        avg10=_float(m, "avg10"),
        avg60=_float(m, "avg60"),
        avg300=_float(m, "avg300"),
        total_us=_int(m, "totalMicroseconds"),
    )


def _pressure_from_spec(raw: Any) -> Pressure:
    m = _as_mapping(raw, "pressure")
    return Pressure(
        some=_pressure_line_from_spec(m["some"]),
        full=_pressure_line_from_spec(m["full"]) if "full" in m else None,
    )


def _as_mapping(raw: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise TopologyParseError(f"{what} must be an object, got {type(raw).__name__}")
    return raw


def _mapping(m: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    return _as_mapping(m[key], key)


def _list(m: Mapping[str, Any], key: str) -> Sequence[Any]:
    value = m.get(key, [])
    if not isinstance(value, list | tuple):
        raise TopologyParseError(f"{key} must be a list, got {type(value).__name__}")
    return value


def _str(m: Mapping[str, Any], key: str) -> str:
    value: object = m[key]
    if not isinstance(value, str):
        raise TopologyParseError(f"{key} must be a string, got {value!r}")
    return value


def _opt_str(m: Mapping[str, Any], key: str) -> str | None:
    return _str(m, key) if key in m else None


def _int(m: Mapping[str, Any], key: str) -> int:
    value: object = m[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TopologyParseError(f"{key} must be an integer, got {value!r}")
    return value


def _opt_int(m: Mapping[str, Any], key: str) -> int | None:
    return _int(m, key) if key in m else None


def _float(m: Mapping[str, Any], key: str) -> float:
    value: object = m[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TopologyParseError(f"{key} must be a number, got {value!r}")
    return float(value)


def _int_list(m: Mapping[str, Any], key: str) -> list[int]:
    values = _list(m, key)
    return [_int({key: v}, key) for v in values]


def _str_list(m: Mapping[str, Any], key: str) -> list[str]:
    values = _list(m, key)
    return [_str({key: v}, key) for v in values]

"""The PCIe tree from ``/sys/bus/pci/devices``.

Every PCI function is a symlink in ``/sys/bus/pci/devices`` into ``/sys/devices``, and the
link target spells the path from the host bridge down::

    0000:3d:00.0 -> ../../../devices/pci0000:3a/0000:3a:02.0/0000:3b:00.0/0000:3c:00.0/0000:3d:00.0
                                     root complex  root port    switch up    switch down  the GPU

So the hierarchy needs no config-space access (which needs root beyond 64 bytes): the last
``pciDDDD:BB`` component is the root complex (this also copes with Hyper-V's vmbus PCI and
Intel VMD, which nest a PCI domain below other devices), and the PCI addresses after it are
the bridges above the function, outermost first.

Bridges are named by position, because PCIe fixes the shape of a switch (an upstream port
whose internal bus holds only downstream ports):

* a bridge directly on the root complex is a **root port**;
* a bridge below a root port or a switch downstream port that itself has bridges below it is
  a switch **upstream port**, and the switch is named after it (its address is the only
  stable name a switch has);
* a bridge directly below an upstream port is a **downstream port**;
* any other bridge (a PCIe-to-PCI bridge such as the one in front of a BMC's VGA) is a plain
  bridge and does not make a switch.

A device's ``switch`` is the innermost switch above it; with no switch it belongs to its root
complex. Functions are classified from the class code (``0x0302xx``/``0x0300xx`` with NVIDIA's
vendor id -> gpu, ``0x0200xx``/``0x0207xx`` -> nic, ``0x010802`` -> nvme, else other).
Bridges, system peripherals (``0x08``: IOMMUs, Xeon uncore) and signal-processing functions
(``0x11``: performance counters) are platform plumbing and are not reported as devices, nor
are SR-IOV virtual functions (they share their physical function's place in the tree).

``numa_node`` is -1 when firmware gives no proximity. With one NUMA node that is the normal
case and means node 0; on a multi-node host the device inherits the nearest bridge above it
that knows, else it stays unknown with a warning.

GPUs get the GPU resource name and, as index, their rank by PCI address: NVML enumerates in
PCI bus order, so index ``i`` is ``nvidia-smi`` GPU ``i`` and the device plugin's ``i``-th
device. NICs that can do RDMA (an ``infiniband/`` directory, or the InfiniBand class) get the
RDMA resource name and their rank by address the same way; plain Ethernet NICs (management
ports, virtio) get neither.
"""

from __future__ import annotations

import enum
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from scheduler.agent.sysfs import Notes, list_dir, read_int, read_text
from scheduler.model.topology import (
    GPU_RESOURCE,
    RDMA_RESOURCE,
    DeviceClass,
    PciDevice,
    PcieSwitch,
    PcieTopology,
    RootComplex,
    is_pci_address,
    is_root_complex_id,
    pci_sort_key,
)

NVIDIA_VENDOR: Final = "0x10de"
UNKNOWN_ID: Final = "0xffff"
"""What a PCI read of an absent device returns; used when vendor/device cannot be read."""

_PLUMBING_BASE_CLASSES: Final = frozenset({0x06, 0x08, 0x11})
_BRIDGE_CLASSES: Final = frozenset({0x0604, 0x0609})
_HEX_ID = re.compile(r"^0x[0-9a-f]{4}$")


@dataclass(frozen=True, slots=True)
class ResourceNaming:
    """Extended resource names the device plugins on this cluster use."""

    gpu: str = GPU_RESOURCE
    rdma_nic: str = RDMA_RESOURCE


DEFAULT_NAMING: Final = ResourceNaming()


class BridgeRole(enum.Enum):
    ROOT_PORT = "root-port"
    SWITCH_UPSTREAM = "switch-upstream"
    SWITCH_DOWNSTREAM = "switch-downstream"
    BRIDGE = "bridge"


@dataclass(frozen=True, slots=True)
class _Function:
    """What sysfs says about one PCI function, before placing it in the tree."""

    address: str
    root_complex: str
    chain: tuple[str, ...]
    """Bridges above the function, outermost first."""
    class_code: int | None
    vendor_id: str
    device_id: str
    numa_node: int | None
    virtual_function: bool
    net_devices: tuple[str, ...]
    rdma_devices: tuple[str, ...]


def classify(class_code: int, vendor_id: str) -> DeviceClass | None:
    """Device class of a function, or ``None`` for platform plumbing that is not reported."""
    base, sub = class_code >> 16, (class_code >> 8) & 0xFF
    if base in _PLUMBING_BASE_CLASSES:
        return None
    if base == 0x03 and sub in (0x00, 0x02) and vendor_id == NVIDIA_VENDOR:
        return DeviceClass.GPU
    if base == 0x02 and sub in (0x00, 0x07):
        return DeviceClass.NIC
    if class_code == 0x010802:
        return DeviceClass.NVME
    return DeviceClass.OTHER


def read_pcie(
    sysfs_root: Path,
    numa_ids: Sequence[int],
    notes: Notes,
    naming: ResourceNaming = DEFAULT_NAMING,
) -> PcieTopology:
    bus = sysfs_root / "bus" / "pci" / "devices"
    if not bus.is_dir():
        notes.warn(f"{bus}: missing; no PCI devices reported")
        return PcieTopology()
    functions: dict[str, _Function] = {}
    for name in list_dir(bus, notes):
        fn = _read_function(bus / name, name, numa_ids, notes)
        if fn is not None:
            functions[fn.address] = fn
    return _build(functions, numa_ids, notes, naming)


def _read_function(
    link: Path, name: str, numa_ids: Sequence[int], notes: Notes
) -> _Function | None:
    if not is_pci_address(name):
        notes.warn(f"{link}: not a PCI address; skipped")
        return None
    target = Path(os.path.realpath(link))
    if not target.is_dir():
        notes.warn(f"{link}: dangling link; skipped")
        return None
    root_complex, chain = _parse_path(target.parts, name, notes)
    raw_class = read_text(link / "class", notes)
    class_code: int | None = None
    if raw_class is not None:
        try:
            class_code = int(raw_class, 16)
        except ValueError:
            notes.warn(f"{link / 'class'}: not a class code: {raw_class[:20]!r}")
    return _Function(
        address=name,
        root_complex=root_complex,
        chain=chain,
        class_code=class_code,
        vendor_id=_read_id(link / "vendor", notes),
        device_id=_read_id(link / "device", notes),
        numa_node=_read_numa(link / "numa_node", numa_ids, notes),
        virtual_function=(link / "physfn").exists(),
        net_devices=_net_devices(link, notes),
        rdma_devices=tuple(list_dir(link / "infiniband", notes, missing_ok=True)),
    )


def _net_devices(target: Path, notes: Notes) -> tuple[str, ...]:
    # virtio-net hangs its interface off the virtio device: <fn>/virtio0/net/eth0.
    names = list_dir(target / "net", notes, missing_ok=True)
    for child in list_dir(target, notes):
        if child.startswith("virtio"):
            names.extend(list_dir(target / child / "net", notes, missing_ok=True))
    return tuple(sorted(names))


def _parse_path(parts: Sequence[str], address: str, notes: Notes) -> tuple[str, tuple[str, ...]]:
    roots = [i for i, p in enumerate(parts) if is_root_complex_id(p)]
    if not roots:
        domain, bus_no, _ = address.split(":")
        notes.warn(f"{address}: no root complex in sysfs path; assuming pci{domain}:{bus_no}")
        return f"pci{domain}:{bus_no}", ()
    below = [p for p in parts[roots[-1] + 1 :] if is_pci_address(p)]
    if not below or below[-1] != address:
        notes.warn(f"{address}: sysfs path ends in {parts[-1]!r}; hierarchy may be wrong")
    else:
        below.pop()
    return parts[roots[-1]], tuple(below)


def _read_id(path: Path, notes: Notes) -> str:
    text = read_text(path, notes)
    if text is None:
        return UNKNOWN_ID
    text = text.lower()
    if not _HEX_ID.match(text):
        notes.warn(f"{path}: not a 16-bit id: {text[:20]!r}")
        return UNKNOWN_ID
    return text


def _read_numa(path: Path, numa_ids: Sequence[int], notes: Notes) -> int | None:
    # Missing numa_node (kernels without CONFIG_NUMA) is the single-node case; fine if quiet.
    value = read_int(path, notes, missing_ok=len(numa_ids) == 1)
    if value is None or value < 0:
        return None
    if value not in numa_ids:
        notes.warn(f"{path}: NUMA node {value} is not among {list(numa_ids)}; ignored")
        return None
    return value


def _build(
    functions: dict[str, _Function],
    numa_ids: Sequence[int],
    notes: Notes,
    naming: ResourceNaming,
) -> PcieTopology:
    # Every address on some function's path is a bridge, listed or not; so is any listed
    # function of a bridge class (an empty root port or downstream port).
    chain_of: dict[str, tuple[str, ...]] = {}
    root_of: dict[str, str] = {}
    bridges: set[str] = set()
    for fn in functions.values():
        chain_of[fn.address] = fn.chain
        root_of[fn.address] = fn.root_complex
        for i, ancestor in enumerate(fn.chain):
            chain_of.setdefault(ancestor, fn.chain[:i])
            root_of.setdefault(ancestor, fn.root_complex)
            bridges.add(ancestor)
        if fn.class_code is not None and fn.class_code >> 8 in _BRIDGE_CLASSES:
            bridges.add(fn.address)

    has_bridge_child = {chain[-1] for addr, chain in chain_of.items() if chain and addr in bridges}
    roles: dict[str, BridgeRole] = {}
    for addr in sorted(bridges, key=lambda a: len(chain_of[a])):
        chain = chain_of[addr]
        parent = roles.get(chain[-1]) if chain else None
        if not chain:
            roles[addr] = BridgeRole.ROOT_PORT
        elif parent is BridgeRole.SWITCH_UPSTREAM:
            roles[addr] = BridgeRole.SWITCH_DOWNSTREAM
        elif parent in (BridgeRole.ROOT_PORT, BridgeRole.SWITCH_DOWNSTREAM) and (
            addr in has_bridge_child
        ):
            roles[addr] = BridgeRole.SWITCH_UPSTREAM
        else:
            roles[addr] = BridgeRole.BRIDGE

    numa = _resolve_numa(functions, chain_of, root_of, numa_ids)

    def innermost_switch(chain: tuple[str, ...]) -> str | None:
        return next((a for a in reversed(chain) if roles[a] is BridgeRole.SWITCH_UPSTREAM), None)

    def root_port(chain: tuple[str, ...]) -> str | None:
        return chain[0] if chain and roles[chain[0]] is BridgeRole.ROOT_PORT else None

    switches: list[PcieSwitch] = []
    for addr in sorted(bridges, key=pci_sort_key):
        if roles[addr] is not BridgeRole.SWITCH_UPSTREAM:
            continue
        upstream = functions.get(addr)
        downstream = sorted(
            (
                a
                for a, r in roles.items()
                if r is BridgeRole.SWITCH_DOWNSTREAM and chain_of[a][-1] == addr
            ),
            key=pci_sort_key,
        )
        switches.append(
            PcieSwitch(
                id=addr,
                root_complex=root_of[addr],
                vendor_id=upstream.vendor_id if upstream is not None else UNKNOWN_ID,
                device_id=upstream.device_id if upstream is not None else UNKNOWN_ID,
                downstream_ports=tuple(downstream),
                root_port=root_port(chain_of[addr]),
                parent_switch=innermost_switch(chain_of[addr]),
                numa_node=numa.get(addr),
            )
        )

    devices: list[PciDevice] = []
    for fn in sorted(functions.values(), key=lambda f: pci_sort_key(f.address)):
        if fn.address in bridges or fn.virtual_function:
            continue
        if fn.class_code is None:
            notes.warn(f"{fn.address}: class unknown; device skipped")
            continue
        device_class = classify(fn.class_code, fn.vendor_id)
        if device_class is None:
            continue
        if numa.get(fn.address) is None:
            notes.warn(f"{fn.address}: NUMA node unknown (numa_node is -1 and no bridge knows)")
        devices.append(
            PciDevice(
                address=fn.address,
                device_class=device_class,
                class_code=f"0x{fn.class_code:06x}",
                vendor_id=fn.vendor_id,
                device_id=fn.device_id,
                root_complex=fn.root_complex,
                numa_node=numa.get(fn.address),
                root_port=root_port(fn.chain),
                switch=innermost_switch(fn.chain),
                net_devices=fn.net_devices,
                rdma_devices=fn.rdma_devices,
            )
        )
    devices = _assign_resources(devices, functions, naming)

    root_numa: dict[str, Counter[int]] = {}
    for addr, rc in root_of.items():
        counter = root_numa.setdefault(rc, Counter())
        if (n := numa.get(addr)) is not None:
            counter[n] += 1
    root_complexes = tuple(
        RootComplex(id=rc, numa_node=_majority(counter))
        for rc, counter in sorted(root_numa.items(), key=lambda kv: _root_sort_key(kv[0]))
    )
    return PcieTopology(
        root_complexes=root_complexes, switches=tuple(switches), devices=tuple(devices)
    )


def _resolve_numa(
    functions: dict[str, _Function],
    chain_of: dict[str, tuple[str, ...]],
    root_of: dict[str, str],
    numa_ids: Sequence[int],
) -> dict[str, int | None]:
    """NUMA node of every address: its own, else the nearest bridge's, else the root's."""
    if len(numa_ids) == 1:
        return dict.fromkeys(chain_of, numa_ids[0])
    own = {a: f.numa_node for a, f in functions.items()}
    by_root: dict[str, Counter[int]] = {}
    for addr, n in own.items():
        if n is not None:
            by_root.setdefault(root_of[addr], Counter())[n] += 1
    resolved: dict[str, int | None] = {}
    for addr, chain in chain_of.items():
        candidates = [own.get(addr), *(own.get(a) for a in reversed(chain))]
        found = next((n for n in candidates if n is not None), None)
        if found is None:
            found = _majority(by_root.get(root_of[addr], Counter()))
        resolved[addr] = found
    return resolved


def _assign_resources(
    devices: list[PciDevice], functions: dict[str, _Function], naming: ResourceNaming
) -> list[PciDevice]:
    gpu_index = 0
    nic_index = 0
    out: list[PciDevice] = []
    for d in devices:  # already in PCI address order
        if d.device_class is DeviceClass.GPU:
            d = replace(d, resource_name=naming.gpu, device_index=gpu_index)
            gpu_index += 1
        elif d.device_class is DeviceClass.NIC and _is_rdma(functions[d.address]):
            d = replace(d, resource_name=naming.rdma_nic, device_index=nic_index)
            nic_index += 1
        out.append(d)
    return out


def _is_rdma(fn: _Function) -> bool:
    return bool(fn.rdma_devices) or (fn.class_code is not None and fn.class_code >> 8 == 0x0207)


def _majority(counter: Counter[int]) -> int | None:
    if not counter:
        return None
    best = max(counter.values())
    return min(n for n, c in counter.items() if c == best)


def _root_sort_key(root: str) -> tuple[int, int]:
    domain, bus = root.removeprefix("pci").split(":")
    return int(domain, 16), int(bus, 16)

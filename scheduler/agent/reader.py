"""One reading of a node: NUMA nodes, the PCIe tree, kubelet hints, PSI (and load).

The hardware (:func:`read_hardware`: sysfs and the kubelet configuration) changes rarely and
is re-read at a slow interval; PSI (:func:`read_psi`) and the load samples
(:mod:`scheduler.agent.load`) at every report. :func:`read_node` reads both parts at once
for one-shot users (dry runs, the simulated agents of the dev cluster); it takes no load,
which needs two samples over time.

Pure file reading against a sysfs root and a procfs root (``/sys`` and ``/proc`` by default,
a fixture tree in tests, ``/host/sys`` in a container that mounts the host's). It never
raises for what it finds on disk: each part falls back to something usable and says why in
:attr:`NodeReading.warnings`. As a last line of defence a bug in one part (an exception
nobody anticipated) is turned into a warning too, so the NUMA report survives a PCI parser
bug; tests assert that the fixtures produce no such warning.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Final, TypeVar

from scheduler.agent.kubelet import read_kubelet_hints
from scheduler.agent.numa import read_numa_nodes
from scheduler.agent.pci import DEFAULT_NAMING, ResourceNaming, read_pcie
from scheduler.agent.pressure import read_pressure
from scheduler.agent.sysfs import Notes
from scheduler.model.topology import (
    LOCAL_NUMA_DISTANCE,
    KubeletHints,
    NodeLoad,
    NodeTopology,
    NodeTopologyStatus,
    NumaNode,
    PcieTopology,
    PressureReadings,
)

DEFAULT_SYSFS: Final = Path("/sys")
DEFAULT_PROCFS: Final = Path("/proc")
INTERNAL_ERROR: Final = "internal error"
"""Prefix of the warning left when a part of the reader raised; a bug, never expected."""

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class HardwareReading:
    topology: NodeTopology
    warnings: tuple[str, ...]

    def with_live(
        self,
        pressure: PressureReadings | None,
        load: NodeLoad | None = None,
        warnings: tuple[str, ...] = (),
    ) -> NodeReading:
        """The whole reading: this hardware, PSI and load; their warnings after the hardware's."""
        return NodeReading(self.topology, pressure, (*self.warnings, *warnings), load)


@dataclass(frozen=True, slots=True)
class NodeReading:
    topology: NodeTopology
    pressure: PressureReadings | None
    warnings: tuple[str, ...]
    load: NodeLoad | None = None

    def status(self, now: datetime, *, max_warnings: int = 32) -> NodeTopologyStatus:
        """The status to publish; warnings are capped so a sick node cannot bloat the object."""
        warnings = self.warnings
        if len(warnings) > max_warnings:
            extra = len(warnings) - (max_warnings - 1)
            warnings = (*warnings[: max_warnings - 1], f"... and {extra} more warnings")
        warnings = tuple(w if len(w) <= 1024 else w[:1021] + "..." for w in warnings)
        return NodeTopologyStatus(
            last_report_time=now, pressure=self.pressure, warnings=warnings, load=self.load
        )


def read_node(
    *,
    sysfs_root: Path = DEFAULT_SYSFS,
    procfs_root: Path = DEFAULT_PROCFS,
    kubelet_config: Path | None = None,
    naming: ResourceNaming = DEFAULT_NAMING,
) -> NodeReading:
    """Hardware and PSI, as one reading (no load: that takes two samples)."""
    hardware = read_hardware(
        sysfs_root=sysfs_root,
        procfs_root=procfs_root,
        kubelet_config=kubelet_config,
        naming=naming,
    )
    pressure, warnings = read_psi(procfs_root)
    return hardware.with_live(pressure, warnings=warnings)


def read_hardware(
    *,
    sysfs_root: Path = DEFAULT_SYSFS,
    procfs_root: Path = DEFAULT_PROCFS,
    kubelet_config: Path | None = None,
    naming: ResourceNaming = DEFAULT_NAMING,
) -> HardwareReading:
    """NUMA nodes, the PCIe tree and the kubelet's policies: what belongs in the spec."""
    notes = Notes()
    no_numa: tuple[NumaNode, ...] = (
        NumaNode(id=0, cpus=frozenset(), memory_bytes=0, distances=(LOCAL_NUMA_DISTANCE,)),
    )
    numa = guard("NUMA", notes, lambda: read_numa_nodes(sysfs_root, procfs_root, notes), no_numa)
    numa_ids = [n.id for n in numa]
    pcie = guard("PCI", notes, lambda: read_pcie(sysfs_root, numa_ids, notes, naming), None)
    kubelet: KubeletHints | None = None
    if kubelet_config is not None:
        kubelet = guard("kubelet", notes, lambda: read_kubelet_hints(kubelet_config, notes), None)
    return HardwareReading(
        topology=NodeTopology(
            numa_nodes=numa, pcie=pcie if pcie is not None else PcieTopology(), kubelet=kubelet
        ),
        warnings=notes.items,
    )


def read_psi(procfs_root: Path = DEFAULT_PROCFS) -> tuple[PressureReadings | None, tuple[str, ...]]:
    """Pressure stall information and the warnings reading it left."""
    notes = Notes()
    pressure = guard("PSI", notes, lambda: read_pressure(procfs_root, notes), None)
    return pressure, notes.items


def guard(part: str, notes: Notes, read: Callable[[], _T], fallback: _T) -> _T:
    """``read()``, or ``fallback`` with an :data:`INTERNAL_ERROR` warning if it raised."""
    try:
        return read()
    except Exception as exc:  # the agent must keep reporting; the warning shows the bug
        notes.warn(f"{INTERNAL_ERROR} reading {part}: {exc.__class__.__name__}: {exc}")
        return fallback

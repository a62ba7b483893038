"""NUMA nodes from ``/sys/devices/system/node``.

Each ``node<N>`` directory gives ``cpulist`` (kernel list format), ``meminfo`` (``Node N
MemTotal: <kB> kB``) and ``distance`` (the node's row of the firmware SLIT, one entry per
online node in id order). Fallbacks keep the result usable rather than exact:

* no node directories at all (a kernel without ``CONFIG_NUMA``, or a container that hides
  them) -> one node 0 holding every CPU in ``/sys/devices/system/cpu/online`` and the
  memory of ``/proc/meminfo``;
* an unreadable ``cpulist`` -> no CPUs; an unreadable ``meminfo`` -> 0 bytes;
* a ``distance`` row of the wrong length or with garbage -> 10 to itself and the kernel's
  ``REMOTE_DISTANCE`` (20) to the others.

Every fallback leaves a warning in the :class:`~scheduler.agent.sysfs.Notes`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from scheduler.agent.sysfs import Notes, list_dir, read_text
from scheduler.model.topology import LOCAL_NUMA_DISTANCE, NumaNode, parse_cpulist

REMOTE_DISTANCE: Final = 20
"""The kernel's default distance between distinct nodes when firmware gives none."""

_NODE_DIR = re.compile(r"^node(\d+)$")
_MEMTOTAL = re.compile(r"^Node\s+\d+\s+MemTotal:\s+(\d+)\s+kB$", re.MULTILINE)
_PROC_MEMTOTAL = re.compile(r"^MemTotal:\s+(\d+)\s+kB$", re.MULTILINE)


def read_numa_nodes(sysfs_root: Path, procfs_root: Path, notes: Notes) -> tuple[NumaNode, ...]:
    base = sysfs_root / "devices" / "system" / "node"
    ids = sorted(
        int(m.group(1))
        for name in list_dir(base, notes, missing_ok=True)
        if (m := _NODE_DIR.match(name))
    )
    if not ids:
        notes.warn(f"{base}: no NUMA nodes; reporting one node 0 with every online CPU")
        return (_single_node(sysfs_root, procfs_root, notes),)
    return tuple(_read_node(base / f"node{i}", i, ids, notes) for i in ids)


def _read_node(path: Path, node_id: int, ids: list[int], notes: Notes) -> NumaNode:
    return NumaNode(
        id=node_id,
        cpus=_read_cpulist(path / "cpulist", notes),
        memory_bytes=_read_memtotal(path / "meminfo", _MEMTOTAL, notes),
        distances=_read_distances(path / "distance", node_id, ids, notes),
    )


def _single_node(sysfs_root: Path, procfs_root: Path, notes: Notes) -> NumaNode:
    return NumaNode(
        id=0,
        cpus=_read_cpulist(sysfs_root / "devices" / "system" / "cpu" / "online", notes),
        memory_bytes=_read_memtotal(procfs_root / "meminfo", _PROC_MEMTOTAL, notes),
        distances=(LOCAL_NUMA_DISTANCE,),
    )


def _read_cpulist(path: Path, notes: Notes) -> frozenset[int]:
    text = read_text(path, notes)
    if text is None:
        return frozenset()
    try:
        return parse_cpulist(text)
    except ValueError:
        notes.warn(f"{path}: not a cpulist: {text[:60]!r}; assuming no CPUs")
        return frozenset()


def _read_memtotal(path: Path, pattern: re.Pattern[str], notes: Notes) -> int:
    text = read_text(path, notes)
    if text is None:
        return 0
    m = pattern.search(text)
    if m is None:
        notes.warn(f"{path}: no MemTotal line; assuming 0 bytes")
        return 0
    return int(m.group(1)) * 1024


def _read_distances(path: Path, node_id: int, ids: list[int], notes: Notes) -> tuple[int, ...]:
    fallback = tuple(LOCAL_NUMA_DISTANCE if i == node_id else REMOTE_DISTANCE for i in ids)
    text = read_text(path, notes)
    if text is None:
        return fallback
    try:
        row = tuple(int(x) for x in text.split())
    except ValueError:
        notes.warn(f"{path}: not a distance row: {text[:60]!r}; using 10/20")
        return fallback
    if len(row) != len(ids) or any(d < 0 or d > 255 for d in row):
        notes.warn(f"{path}: {len(row)} distances for {len(ids)} nodes; using 10/20")
        return fallback
    return row

"""Access to the committed sysfs/procfs fixture trees (see make_fixtures.py)."""

from __future__ import annotations

from pathlib import Path

from scheduler.agent.reader import NodeReading, read_node

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TWO_SOCKET = "two-socket-8gpu"
VM = "vm-single-numa"
BROKEN = "broken"
NO_NUMA = "no-numa"
ALL = (TWO_SOCKET, VM, BROKEN, NO_NUMA)


def roots(name: str) -> tuple[Path, Path]:
    """(sysfs root, procfs root) of a fixture tree."""
    return FIXTURES / name / "sys", FIXTURES / name / "proc"


def read_fixture(name: str) -> NodeReading:
    sysfs, procfs = roots(name)
    return read_node(sysfs_root=sysfs, procfs_root=procfs)

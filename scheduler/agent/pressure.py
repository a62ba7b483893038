"""Pressure stall information from ``/proc/pressure/{cpu,memory,io}``.

Each file has a ``some`` line and (memory, io, and cpu since Linux 5.13) a ``full`` line:
``some avg10=1.23 avg60=0.50 avg300=0.10 total=123456``, the averages being the percentage
of wall time in which some (or all) runnable tasks were stalled, the total in microseconds.
A kernel without PSI has no directory, or answers EOPNOTSUPP when booted with ``psi=0``;
both mean "no readings" and are not worth a warning. Garbage is.
"""

from __future__ import annotations

import re
from pathlib import Path

from scheduler.agent.sysfs import Notes, read_text
from scheduler.model.topology import Pressure, PressureLine, PressureReadings

_LINE = re.compile(
    r"^(some|full)\s+avg10=(\d+(?:\.\d+)?)\s+avg60=(\d+(?:\.\d+)?)"
    r"\s+avg300=(\d+(?:\.\d+)?)\s+total=(\d+)$"
)


def read_pressure(procfs_root: Path, notes: Notes) -> PressureReadings | None:
    base = procfs_root / "pressure"
    if not base.is_dir():
        return None
    readings = PressureReadings(
        cpu=_read_file(base / "cpu", notes),
        memory=_read_file(base / "memory", notes),
        io=_read_file(base / "io", notes),
    )
    if readings == PressureReadings():
        return None
    return readings


def parse_pressure(text: str) -> Pressure:
    """Parse one PSI file; raises ``ValueError`` when there is no valid ``some`` line."""
    lines: dict[str, PressureLine] = {}
    for raw in text.splitlines():
        m = _LINE.match(raw.strip())
        if m is None:
            raise ValueError(f"not a PSI line: {raw[:80]!r}")
        lines[m.group(1)] = PressureLine(
            avg10=float(m.group(2)),
            avg60=float(m.group(3)),
            avg300=float(m.group(4)),
            total_us=int(m.group(5)),
        )
    if "some" not in lines:
        raise ValueError("no 'some' line")
    return Pressure(some=lines["some"], full=lines.get("full"))


def _read_file(path: Path, notes: Notes) -> Pressure | None:
    text = read_text(path, notes, missing_ok=True)
    if text is None:
        return None
    try:
        return parse_pressure(text)
    except ValueError as exc:
        notes.warn(f"{path}: {exc}")
        return None

"""CPU and memory utilisation from ``/proc/stat`` and ``/proc/meminfo``, sampled over a window.

``/proc/stat``'s aggregate ``cpu`` line holds cumulative jiffies (USER_HZ ticks) per state,
summed over all CPUs: ``user nice system idle iowait irq softirq steal guest guest_nice``
(kernels before 2.6.11 stop earlier; absent fields count as 0). ``guest`` and
``guest_nice`` are already included in ``user`` and ``nice``, so the total leaves them out,
as top does. Busy time is the total minus ``idle`` and ``iowait``. One reading says nothing
about now; two do: the busy share of the total delta between them, times the online CPUs
(the ``cpuN`` lines), is the millicores in use over that interval. Dividing two deltas of the
same counters makes the result independent of USER_HZ, and integer arithmetic keeps it exact.

Counters only grow on a healthy kernel, but ``iowait`` and ``idle`` are known to step back
on some (Documentation/filesystems/proc.rst), and a checkpointed/migrated container can see
a reset. An interval whose total did not advance is skipped; a busy delta outside
``[0, total delta]`` is clamped. No utilisation is ever negative or above capacity.

Memory in use is ``MemTotal - MemAvailable`` (the kernel's estimate of what can be had
without swapping, Linux 3.14+), from the latest sample: a mean would hide growth that ends
in an OOM kill.

:class:`LoadWindow` is pure: samples go in, a :class:`~scheduler.model.topology.NodeLoad`
comes out at each report, and the last sample of one window is the base of the next, so
consecutive windows cover time without gaps. Reading files never raises; what is wrong is
said in the :class:`~scheduler.agent.sysfs.Notes`, and a window without a usable CPU
interval or memory reading yields no load.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Final, TypeVar

from scheduler.agent.sysfs import Notes, read_text
from scheduler.model.topology import NodeLoad

_STAT_STATES: Final = 8
"""user nice system idle iowait irq softirq steal: the fields that make up the total."""
_IDLE: Final = 3
_IOWAIT: Final = 4
_PER_CPU = re.compile(r"^cpu\d+$")
_MEMINFO_LINE = re.compile(r"^(\w+):\s+(\d+)(?:\s+kB)?$")

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """Cumulative jiffies of the aggregate ``cpu`` line, and the online CPUs seen."""

    busy: int
    total: int
    online_cpus: int
    """Number of ``cpuN`` lines (0 if there were none; the caller may know better)."""


@dataclass(frozen=True, slots=True)
class MemoryUse:
    total_bytes: int
    available_bytes: int

    @property
    def used_bytes(self) -> int:
        return max(0, self.total_bytes - self.available_bytes)


@dataclass(frozen=True, slots=True)
class LoadSample:
    """One reading: when (wall clock for the report, monotonic for spans) and what."""

    time: datetime
    monotonic: float
    cpu: CpuTimes | None
    memory: MemoryUse | None


def parse_stat(text: str) -> CpuTimes:
    """Parse ``/proc/stat``; raises ``ValueError`` without a valid aggregate ``cpu`` line."""
    aggregate: list[int] | None = None
    online = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name == "cpu":
            fields = rest.split()
            if len(fields) < 4 or not all(f.isdigit() for f in fields):
                raise ValueError(f"not a cpu line: {line[:80]!r}")
            aggregate = [int(f) for f in fields[:_STAT_STATES]]
        elif _PER_CPU.match(name):
            online += 1
    if aggregate is None:
        raise ValueError("no aggregate cpu line")
    aggregate += [0] * (_STAT_STATES - len(aggregate))
    total = sum(aggregate)
    return CpuTimes(
        busy=total - aggregate[_IDLE] - aggregate[_IOWAIT], total=total, online_cpus=online
    )


def parse_meminfo(text: str) -> MemoryUse:
    """Parse ``/proc/meminfo``; raises ``ValueError`` without MemTotal > 0 and MemAvailable."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        m = _MEMINFO_LINE.match(line.strip())
        if m is not None:
            values[m.group(1)] = int(m.group(2)) * 1024
    for key in ("MemTotal", "MemAvailable"):
        if key not in values:
            raise ValueError(f"no {key} line")
    if values["MemTotal"] <= 0:
        raise ValueError("MemTotal is 0")
    return MemoryUse(total_bytes=values["MemTotal"], available_bytes=values["MemAvailable"])


def read_sample(procfs_root: Path, notes: Notes, *, time: datetime, monotonic: float) -> LoadSample:
    """Read ``stat`` and ``meminfo`` under ``procfs_root``; a bad file is a warning and ``None``."""
    return LoadSample(
        time=time,
        monotonic=monotonic,
        cpu=_parse_file(procfs_root / "stat", parse_stat, notes),
        memory=_parse_file(procfs_root / "meminfo", parse_meminfo, notes),
    )


def cpu_interval(before: CpuTimes, after: CpuTimes) -> tuple[int, int] | None:
    """(busy, total) jiffies between two readings; ``None`` if the counters did not advance.

    A total that stood still or went back (a reset) gives nothing to divide by; a busy delta
    is clamped to ``[0, total]`` because ``idle``/``iowait`` may step back on their own.
    """
    total = after.total - before.total
    if total <= 0:
        return None
    return min(max(after.busy - before.busy, 0), total), total


def millicores(busy: int, total: int, cpus: int) -> int:
    """``busy / total`` of ``cpus`` CPUs in millicores, rounded half up; exact integers."""
    return (2 * busy * cpus * 1000 + total) // (2 * total)


class LoadWindow:
    """Samples since the last report; :meth:`take` turns them into a NodeLoad and starts over."""

    def __init__(self) -> None:
        self._base: LoadSample | None = None
        self._samples: list[LoadSample] = []
        self._notes = Notes()

    @property
    def notes(self) -> Notes:
        """Where :func:`read_sample` records what went wrong in this window."""
        return self._notes

    @property
    def pending(self) -> int:
        """Samples taken since the last :meth:`take`."""
        return len(self._samples)

    def add(self, sample: LoadSample) -> None:
        self._samples.append(sample)

    def take(self, *, fallback_cpus: int = 0) -> tuple[NodeLoad | None, tuple[str, ...]]:
        """The window's load (``None`` if it cannot be told) and warnings; then a new window.

        CPU is the mean over the window (busy over total jiffies, summed over the intervals
        whose counters advanced) and the peak is the busiest such interval, reported when
        there were at least two; memory is the latest reading. ``fallback_cpus`` (the CPUs
        the topology reader found) is used when ``/proc/stat`` lists no ``cpuN`` lines.
        """
        samples, base, notes = self._samples, self._base, self._notes
        self._samples, self._notes = [], Notes()
        if samples:
            self._base = samples[-1]
        if not samples:
            return None, notes.items
        chain = [base, *samples] if base is not None else samples
        return _load(chain, len(samples), fallback_cpus, notes), notes.items


def _load(chain: list[LoadSample], count: int, fallback_cpus: int, notes: Notes) -> NodeLoad | None:
    memory = next((s.memory for s in reversed(chain[-count:]) if s.memory is not None), None)
    times = [s.cpu for s in chain if s.cpu is not None]
    if memory is None or len(times) < 2:
        return None  # the file's own warning says why, or this is the very first sample
    cpus = times[-1].online_cpus or fallback_cpus
    if cpus <= 0:
        notes.warn("/proc/stat: no cpuN lines and no CPUs known; no load")
        return None
    busy_sum = total_sum = 0
    peaks: list[int] = []
    for before, after in pairwise(times):
        interval = cpu_interval(before, after)
        if interval is not None:
            busy, total = interval
            busy_sum += busy
            total_sum += total
            peaks.append(millicores(busy, total, cpus))
    if total_sum == 0:
        notes.warn("/proc/stat: CPU counters did not advance between samples; no load")
        return None
    last = chain[-1]
    return NodeLoad(
        sample_time=last.time,
        window_seconds=max(0.0, last.monotonic - chain[0].monotonic),
        samples=count,
        cpu_used_milli=millicores(busy_sum, total_sum, cpus),
        cpu_capacity_milli=cpus * 1000,
        cpu_peak_milli=max(peaks) if len(peaks) >= 2 else None,
        mem_used_bytes=memory.used_bytes,
        mem_capacity_bytes=memory.total_bytes,
    )


def _parse_file(path: Path, parse: Callable[[str], _T], notes: Notes) -> _T | None:
    text = read_text(path, notes)
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError as exc:
        notes.warn(f"{path}: {exc}")
        return None

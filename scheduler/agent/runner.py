"""The agent's cadence: sample load often, report modestly, re-read the hardware rarely.

Three periods, all from :class:`AgentSettings`:

* every ``sample_interval_seconds`` (5 s) ``/proc/stat`` and ``/proc/meminfo`` go into a
  :class:`~scheduler.agent.load.LoadWindow`; a sample is cheap and never leaves the node;
* every ``report_interval_seconds`` (15 s) PSI is read, the window is closed into a
  :class:`~scheduler.model.topology.NodeLoad`, and the whole reading (hardware, PSI, load,
  warnings) goes to the report callback: the publisher's one status patch, or the dry run's
  printout. 15 s is the floor the defaults keep to: every report is an API write, and a
  cluster of 1000+ nodes multiplies it;
* every ``topology_interval_seconds`` (60 s), at a report, sysfs is read again; hardware
  changes rarely and the publisher only writes a spec that changed.

Reports happen at sample ticks, so the load always ends with a fresh sample: the first one
sample interval after start (two samples, so even the first report carries a load; a single
``--once`` run stops there), then at the tick nearest each report deadline. Ticks are on a
fixed grid from the start; a tick missed because a read or a write was slow is skipped
rather than caught up. Time comes from a :class:`Clock`, so tests drive the loop with a
fake clock that never sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Protocol

import structlog

from scheduler.agent.load import LoadSample, LoadWindow, read_sample
from scheduler.agent.pci import DEFAULT_NAMING, ResourceNaming
from scheduler.agent.reader import (
    DEFAULT_PROCFS,
    DEFAULT_SYSFS,
    HardwareReading,
    NodeReading,
    guard,
    read_hardware,
    read_node,
    read_psi,
)
from scheduler.agent.sysfs import Notes
from scheduler.model.topology import PressureReadings

MIN_REPORT_INTERVAL: Final = 1.0
"""Below this the agent refuses to start: a status write per second per node is abuse."""
ADVISED_REPORT_INTERVAL: Final = 15.0
"""Below this the CLI warns: each report is a write to the API server, from every node."""

log = structlog.get_logger(__name__)

Report = Callable[[NodeReading, datetime], Awaitable[object]]
"""What is done with each reading, given the report time (publish it, print it)."""


class Clock(Protocol):
    def now(self) -> datetime:
        """Wall-clock time, timezone-aware: what reports and samples are stamped with."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never steps: what intervals and windows are measured on."""
        ...

    async def sleep(self, seconds: float, stop: asyncio.Event) -> None:
        """Wait ``seconds``, or less if ``stop`` is set."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float, stop: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=max(0.0, seconds))


SYSTEM_CLOCK: Final = SystemClock()


@dataclass(frozen=True, slots=True)
class AgentSettings:
    node_name: str
    sysfs_root: Path = DEFAULT_SYSFS
    procfs_root: Path = DEFAULT_PROCFS
    kubelet_config: Path | None = None
    naming: ResourceNaming = DEFAULT_NAMING
    topology_interval_seconds: float = 60.0
    """Time between readings of the hardware (sysfs, kubelet configuration)."""
    report_interval_seconds: float = 15.0
    """Time between status writes (PSI, load, ``lastReportTime``: the heartbeat)."""
    sample_interval_seconds: float = 5.0
    """Time between load samples; at most the report interval."""

    def __post_init__(self) -> None:
        if not self.report_interval_seconds >= MIN_REPORT_INTERVAL:
            raise ValueError(
                f"report interval must be at least {MIN_REPORT_INTERVAL:g}s, "
                f"got {self.report_interval_seconds:g}"
            )
        if not 0 < self.sample_interval_seconds <= self.report_interval_seconds:
            raise ValueError(
                "sample interval must be positive and at most the report interval, "
                f"got {self.sample_interval_seconds:g}"
            )
        if not self.topology_interval_seconds > 0:
            raise ValueError(
                f"topology interval must be positive, got {self.topology_interval_seconds:g}"
            )

    def read(self) -> NodeReading:
        """Hardware and PSI in one go (no load), as the devcluster's simulated agents read."""
        return read_node(
            sysfs_root=self.sysfs_root,
            procfs_root=self.procfs_root,
            kubelet_config=self.kubelet_config,
            naming=self.naming,
        )

    def read_hardware(self) -> HardwareReading:
        return read_hardware(
            sysfs_root=self.sysfs_root,
            procfs_root=self.procfs_root,
            kubelet_config=self.kubelet_config,
            naming=self.naming,
        )

    def read_psi(self) -> tuple[PressureReadings | None, tuple[str, ...]]:
        return read_psi(self.procfs_root)

    def sample(self, notes: Notes, *, at: datetime, monotonic: float) -> LoadSample:
        """One load sample; what went wrong (even a bug) is a warning in ``notes``."""
        fallback = LoadSample(time=at, monotonic=monotonic, cpu=None, memory=None)
        return guard(
            "load",
            notes,
            lambda: read_sample(self.procfs_root, notes, time=at, monotonic=monotonic),
            fallback,
        )


async def run_agent(
    settings: AgentSettings,
    report: Report,
    stop: asyncio.Event,
    *,
    once: bool = False,
    clock: Clock = SYSTEM_CLOCK,
) -> bool:
    """Sample and report until ``stop`` is set (or after one report); False if it failed.

    A failed report (API unreachable, forbidden, ...) is logged and the next one is tried at
    its time rather than ending the agent: the DaemonSet should not crash-loop while the API
    server restarts.
    """
    sample_every = settings.sample_interval_seconds
    slack = sample_every / 2  # a report goes out at the sample tick nearest its deadline
    window = LoadWindow()
    start = clock.monotonic()
    tick = 0
    next_report = start + sample_every
    hardware: HardwareReading | None = None
    hardware_due = start
    last_warnings: tuple[str, ...] = ()
    ok = True
    while not stop.is_set():
        tick_time = start + tick * sample_every
        window.add(
            await asyncio.to_thread(
                settings.sample, window.notes, at=clock.now(), monotonic=clock.monotonic()
            )
        )
        if tick_time >= next_report - slack:
            if hardware is None or tick_time >= hardware_due - slack:
                hardware = await asyncio.to_thread(settings.read_hardware)
                hardware_due = tick_time + settings.topology_interval_seconds
            pressure, psi_warnings = await asyncio.to_thread(settings.read_psi)
            load, load_warnings = window.take(fallback_cpus=hardware.topology.cpu_count)
            reading = hardware.with_live(pressure, load, (*psi_warnings, *load_warnings))
            if reading.warnings != last_warnings:
                for warning in reading.warnings:
                    log.warning("node reading degraded", node=settings.node_name, reason=warning)
                last_warnings = reading.warnings
            try:
                await report(reading, clock.now())
            except Exception as exc:  # retried at the next report; see docstring
                ok = False
                log.error("report failed", node=settings.node_name, error=repr(exc))
            else:
                ok = True
            if once:
                break
            next_report += settings.report_interval_seconds
            if next_report <= tick_time:  # far behind (a suspended VM): start the grid afresh
                next_report = tick_time + settings.report_interval_seconds
        tick += 1
        elapsed_ticks = int((clock.monotonic() - start) / sample_every)
        if elapsed_ticks >= tick:  # the tick is already past: skip it, do not catch up
            tick = elapsed_ticks + 1
        await clock.sleep(start + tick * sample_every - clock.monotonic(), stop)
    return ok

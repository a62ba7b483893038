"""Gang placement under churn: Lattice (CP-SAT, greedy-only) against kube-scheduler.

One devcluster of ``--nodes`` kwok nodes of the ``gpu-8x`` profile (8 ``nvidia.com/gpu``
each, NodeTopology published by the simulated agents) takes one seeded stream
(:func:`generate_stream`), three times, one arm after the other, each arm in a fresh
namespace with a fresh scheduler process and an empty fleet:

* ``cpsat``: ``lattice run``, LatticeScheduler ``spec.gang.solver: CPSAT``;
* ``greedy``: ``lattice run``, ``spec.gang.solver: Greedy`` (the greedy plan only);
* ``kube``: kube-scheduler on the same pods with ``schedulerName: default-scheduler``. It
  has no gangs: it ignores the PodGroups and binds members one by one, so it is the
  baseline for partial gangs.

The stream mixes gangs (2-16 members, 1-8 GPUs per member, one PodGroup each with
``minMember`` = its size; in ``--mixed-share`` of them, default half, each member draws its
own GPU count, in the rest all members ask the same) and single pods (1-2 GPUs) arriving at
seeded times over ``--duration`` seconds. Every pod asks 4 CPU and 16Gi per GPU, so GPUs
are the only scarce resource. A gang's *window* opens when its last member is created; when
all its members are bound it is *admitted* and runs for its lifetime, after which the
benchmark deletes it. A gang not admitted within ``--patience`` seconds is deleted too (the
user gives up; its PodGroup says ``scheduleTimeoutSeconds`` = patience). Singles work the
same way. An arm ends ``--patience`` seconds (+2) after the last arrival, when every window
has closed.

Definitions (all computed from the recorded timeline, by the pure functions below)
---------------------------------------------------------------------------------
admitted
    every member bound before the gang's window closed.
time to admit
    from the API server's acknowledgement of the gang's last member creation to the watch
    seeing its last member bound.
partial
    a gang whose window closed with some, not all, members bound: its GPUs were held for
    nothing. Lattice must have none.
stranded GPU·s
    *integrated over time*: for each member of a partial gang, its GPUs times the time from
    its binding to the window's close. "avg stranded" divides by the arm's length.
pre-admit GPU·s
    the same integral for gangs that were admitted in the end, up to their admission (GPUs
    held while siblings were still pending; milliseconds of binding for Lattice).
fleet figures
    *sampled* every ``--sample-interval`` s while arrivals last (``[0, duration]``): a pod
    holds its GPUs from its binding until the watch sees it deleted. util = used / all GPUs;
    fragmented = free GPUs on partially used nodes (some GPUs used, some free), i.e. free
    GPUs that a whole-node (8-GPU) member cannot use; empty nodes = nodes with all GPUs free.
singles
    pods/s = singles bound / (last single binding - first single arrival); bind latency from
    the create's acknowledgement to the watch seeing the binding.
solve time per gang size
    from Lattice's JSON log lines ``gang_assumed`` / ``gang_unschedulable`` (``duration_ms``,
    the solve of one attempt; several attempts per gang when it had to wait), grouped by
    gang size; with the ``lattice_gang_attempts_total{outcome}`` counters scraped from its
    ``/metrics`` at the end of the arm.
scaling row
    the pure solver (``scheduler.solver``), no server: one 64-member gang (4 GPUs each) over
    1000 and 5000 gpu-8x nodes with the fixture's topology, each node already using a seeded
    0-8 GPUs (lowest device indexes); ``build_problem`` then ``solve`` with CP-SAT and with
    greedy alone: status, solve time, whether it was admitted.

Run: ``just bench-gang`` (or ``python -m lattice_dev.benchmarks.gangs --help``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, cast

import numpy as np
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from lattice_dev.benchmarks.common import apply_crds, precompile_lattice, wait_lattice_ready
from lattice_dev.devcluster.cluster import ClusterConfig, DevCluster
from lattice_dev.devcluster.kube import api_client
from scheduler.model.gang import POD_GROUP_LABEL

GPU: Final = "nvidia.com/gpu"
GPUS_PER_NODE: Final = 8
CPU_PER_GPU: Final = 4
MEM_GI_PER_GPU: Final = 16
LATTICE: Final = "lattice"
KUBE_SCHEDULER: Final = "default-scheduler"
LS_GROUP, LS_VERSION, LS_PLURAL = "lattice.dev", "v1alpha1", "latticeschedulers"
PG_GROUP, PG_VERSION, PG_PLURAL = "scheduling.x-k8s.io", "v1alpha1", "podgroups"
ArmName = Literal["cpsat", "greedy", "kube"]
ARMS: Final[tuple[ArmName, ...]] = ("cpsat", "greedy", "kube")
ARM_LABELS: Final[Mapping[str, str]] = {
    "cpsat": "lattice CP-SAT",
    "greedy": "lattice greedy",
    "kube": "kube-scheduler",
}
SIZE_BUCKETS: Final = ((2, 4), (5, 8), (9, 12), (13, 16))
"""Gang sizes grouped for the solve-time table."""
POLL_S: Final = 0.05
"""How often a gang's runner looks at the watch's record (not a measured figure)."""


# --- the stream (pure) ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamConfig:
    gangs: int = 48
    singles: int = 200
    duration_s: float = 120.0
    gang_size: tuple[int, int] = (2, 16)
    gang_gpus: tuple[int, int] = (1, 8)
    """GPUs per member, inclusive range."""
    mixed_share: float = 0.5
    """Share of gangs whose members each draw their own GPU count (a launcher beside its
    workers, heterogeneous stages); the rest ask the same for every member. Mixed gangs are
    the ones that may fit only with a joint arrangement."""
    single_gpus: tuple[int, int] = (1, 2)
    gang_lifetime_s: tuple[float, float] = (20.0, 60.0)
    """How long an admitted gang runs before the benchmark deletes it."""
    single_lifetime_s: tuple[float, float] = (5.0, 30.0)


@dataclass(frozen=True, slots=True)
class GangArrival:
    at: float
    """Seconds after the arm's start."""
    name: str
    member_gpus: tuple[int, ...]
    """GPUs of each member, in creation order."""
    lifetime_s: float

    @property
    def members(self) -> int:
        return len(self.member_gpus)

    @property
    def mixed(self) -> bool:
        return len(set(self.member_gpus)) > 1

    def member_names(self) -> tuple[str, ...]:
        return tuple(f"{self.name}-{i:02d}" for i in range(self.members))


@dataclass(frozen=True, slots=True)
class SingleArrival:
    at: float
    name: str
    gpus: int
    lifetime_s: float


Arrival = GangArrival | SingleArrival


def generate_stream(seed: int, config: StreamConfig = StreamConfig()) -> list[Arrival]:
    """The arrivals, in time order: the same list for the same seed and config.

    Gangs and singles draw from separate generators, so changing ``singles`` leaves the
    gangs alone. Times are uniform over the duration, rounded to milliseconds.
    """
    if config.duration_s <= 0:
        raise ValueError("duration_s must be > 0")
    gang_rng = np.random.default_rng([seed, 1])
    single_rng = np.random.default_rng([seed, 2])
    arrivals: list[Arrival] = []
    gang_times = np.sort(gang_rng.uniform(0.0, config.duration_s, size=config.gangs))
    lo, hi = config.gang_gpus
    for i, at in enumerate(gang_times):
        size = int(gang_rng.integers(config.gang_size[0], config.gang_size[1] + 1))
        if gang_rng.random() < config.mixed_share:
            gpus = tuple(int(g) for g in gang_rng.integers(lo, hi + 1, size=size))
        else:
            gpus = (int(gang_rng.integers(lo, hi + 1)),) * size
        arrivals.append(
            GangArrival(
                at=round(float(at), 3),
                name=f"g-{i:03d}",
                member_gpus=gpus,
                lifetime_s=round(float(gang_rng.uniform(*config.gang_lifetime_s)), 3),
            )
        )
    single_times = np.sort(single_rng.uniform(0.0, config.duration_s, size=config.singles))
    for i, at in enumerate(single_times):
        arrivals.append(
            SingleArrival(
                at=round(float(at), 3),
                name=f"s-{i:04d}",
                gpus=int(single_rng.integers(config.single_gpus[0], config.single_gpus[1] + 1)),
                lifetime_s=round(float(single_rng.uniform(*config.single_lifetime_s)), 3),
            )
        )
    arrivals.sort(key=lambda a: (a.at, a.name))
    return arrivals


def gang_sizes(stream: Iterable[Arrival]) -> dict[str, int]:
    return {a.name: a.members for a in stream if isinstance(a, GangArrival)}


# --- the timeline (pure records) -----------------------------------------------------------


@dataclass(slots=True)
class PodRecord:
    """One pod's life in an arm; times are seconds after the arm's start."""

    name: str
    gpus: int
    gang: str | None = None
    created: float | None = None
    """The API server acknowledged the create."""
    bound: float | None = None
    """The watch first saw ``spec.nodeName``."""
    node: str | None = None
    deleted: float | None = None
    """The benchmark sent the delete."""
    gone: float | None = None
    """The watch saw it deleted."""

    def holds_at(self, t: float) -> bool:
        """Whether its GPUs are taken at ``t`` (from binding until it is gone)."""
        if self.bound is None or self.node is None or t < self.bound:
            return False
        end = self.gone if self.gone is not None else self.deleted
        return end is None or t < end


@dataclass(slots=True)
class GangWindow:
    name: str
    members: tuple[str, ...]
    opened: float | None = None
    """The last member's create was acknowledged (None: creation failed)."""
    closed: float | None = None
    """The benchmark deleted the gang (None: the arm ended first)."""


@dataclass(frozen=True, slots=True)
class GangOutcome:
    name: str
    size: int
    gpus: int
    """All members' GPUs."""
    admitted: bool
    time_to_admit_s: float | None
    bound_at_close: int
    partial: bool
    stranded_gpu_s: float
    pre_admit_gpu_s: float


def gang_outcome(window: GangWindow, pods: Mapping[str, PodRecord], horizon: float) -> GangOutcome:
    """Admitted, partial and held-GPU figures of one gang (see the module docstring)."""
    close = window.closed if window.closed is not None else horizon
    recs = [pods[m] for m in window.members if m in pods]
    held = [(r.bound, r.gpus) for r in recs if r.bound is not None and r.bound <= close]
    bound = [b for b, _ in held]
    size = len(window.members)
    admitted = size > 0 and len(bound) == size
    admit_at = max(bound) if admitted else None
    tta = (
        max(admit_at - window.opened, 0.0)
        if admit_at is not None and window.opened is not None
        else None
    )
    partial = 0 < len(bound) < size
    stranded = sum(g * (close - b) for b, g in held) if partial else 0.0
    pre_admit = sum(g * (admit_at - b) for b, g in held) if admit_at is not None else 0.0
    return GangOutcome(
        name=window.name,
        size=size,
        gpus=sum(r.gpus for r in recs),
        admitted=admitted,
        time_to_admit_s=tta,
        bound_at_close=len(bound),
        partial=partial,
        stranded_gpu_s=stranded,
        pre_admit_gpu_s=pre_admit,
    )


@dataclass(frozen=True, slots=True)
class FleetSample:
    at: float
    used: int
    free: int
    fragmented: int
    """Free GPUs on nodes with some GPUs used."""
    empty_nodes: int


def fleet_samples(
    pods: Iterable[PodRecord], node_gpus: Mapping[str, int], times: Iterable[float]
) -> list[FleetSample]:
    """The fleet's GPU use at each of ``times``, rebuilt from the pods' records."""
    placed = [p for p in pods if p.bound is not None and p.node is not None]
    out = []
    for t in times:
        used = dict.fromkeys(node_gpus, 0)
        for p in placed:
            if p.holds_at(t) and p.node in used:
                used[p.node] += p.gpus
        free_by_node = {n: max(node_gpus[n] - u, 0) for n, u in used.items()}
        out.append(
            FleetSample(
                at=t,
                used=sum(used.values()),
                free=sum(free_by_node.values()),
                fragmented=sum(f for n, f in free_by_node.items() if used[n] > 0 and f > 0),
                empty_nodes=sum(1 for n, u in used.items() if u == 0),
            )
        )
    return out


def sample_times(start: float, end: float, interval: float) -> list[float]:
    if interval <= 0:
        raise ValueError("interval must be > 0")
    count = math.floor((end - start) / interval + 1e-9) + 1
    return [round(start + i * interval, 6) for i in range(max(count, 0))]


@dataclass(frozen=True, slots=True)
class SolveSample:
    gang: str
    """The gang's name (without namespace)."""
    size: int
    event: str
    duration_ms: float | None


def parse_solve_lines(lines: Iterable[str], sizes: Mapping[str, int]) -> list[SolveSample]:
    """Lattice's ``gang_assumed``/``gang_unschedulable`` JSON lines for gangs of the stream."""
    out = []
    for line in lines:
        if '"gang_' not in line:
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict) or doc.get("event") not in (
            "gang_assumed",
            "gang_unschedulable",
        ):
            continue
        name = str(doc.get("gang", "")).split("/", 1)[-1]
        if name not in sizes:
            continue
        raw = doc.get("duration_ms")
        if raw is None and isinstance(doc.get("extra"), dict):
            raw = doc["extra"].get("duration_ms")
        out.append(
            SolveSample(
                gang=name,
                size=sizes[name],
                event=str(doc["event"]),
                duration_ms=float(raw) if isinstance(raw, int | float) else None,
            )
        )
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default); NaN when there is nothing."""
    if not values:
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


@dataclass(frozen=True, slots=True)
class SizeRow:
    sizes: tuple[int, int]
    attempts: int
    assumed: int
    timed: int
    """Attempts whose log line had a solve time."""
    p50_ms: float
    p99_ms: float
    max_ms: float


def solve_by_size(
    samples: Sequence[SolveSample], buckets: Sequence[tuple[int, int]] = SIZE_BUCKETS
) -> list[SizeRow]:
    rows = []
    for lo, hi in buckets:
        mine = [s for s in samples if lo <= s.size <= hi]
        times = [s.duration_ms for s in mine if s.duration_ms is not None]
        rows.append(
            SizeRow(
                sizes=(lo, hi),
                attempts=len(mine),
                assumed=sum(1 for s in mine if s.event == "gang_assumed"),
                timed=len(times),
                p50_ms=percentile(times, 50),
                p99_ms=percentile(times, 99),
                max_ms=max(times) if times else math.nan,
            )
        )
    return rows


def parse_metrics(text: str) -> dict[str, float]:
    """The gang figures of a ``/metrics`` page, flattened to ``name{label=value}``."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("lattice_gang"):
            continue
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "le")
            if "le" in s.labels or s.name.endswith("_created"):
                continue  # buckets and creation stamps: _sum and _count carry the figures
            out[f"{s.name}{{{labels}}}" if labels else s.name] = float(s.value)
    return out


# --- an arm's summary (pure) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ArmSummary:
    arm: str
    gangs: int
    admitted: int
    partial: int
    gave_up: int
    """Gangs deleted unadmitted (partial or with nothing bound)."""
    tta_p50_s: float
    tta_p99_s: float
    stranded_gpu_s: float
    avg_stranded_gpus: float
    pre_admit_gpu_s: float
    gpu_util: float
    fragmented_gpus: float
    free_gpus: float
    empty_nodes: float
    singles: int
    singles_bound: int
    singles_per_s: float
    single_p50_s: float
    single_p99_s: float
    horizon_s: float
    duration_s: float
    """How long arrivals lasted (the singles' offered rate is singles / this)."""
    solve_rows: tuple[SizeRow, ...] = ()
    metrics: Mapping[str, float] = field(default_factory=dict)
    partial_gauge_max: float | None = None


def summarize(
    arm: str,
    *,
    pods: Mapping[str, PodRecord],
    windows: Sequence[GangWindow],
    node_gpus: Mapping[str, int],
    horizon: float,
    duration: float,
    sample_interval: float,
    solves: Sequence[SolveSample] = (),
    metrics: Mapping[str, float] | None = None,
    partial_gauge_max: float | None = None,
) -> tuple[ArmSummary, list[GangOutcome], list[FleetSample]]:
    """Every figure of one arm from its timeline; the per-gang outcomes and samples too."""
    outcomes = [gang_outcome(w, pods, horizon) for w in windows]
    samples = fleet_samples(pods.values(), node_gpus, sample_times(0.0, duration, sample_interval))
    total_gpus = sum(node_gpus.values())
    tta = [o.time_to_admit_s for o in outcomes if o.time_to_admit_s is not None]
    singles = [p for p in pods.values() if p.gang is None]
    bound_singles = [p for p in singles if p.bound is not None]
    latencies = [
        max(cast(float, p.bound) - p.created, 0.0) for p in bound_singles if p.created is not None
    ]
    first_arrival = min((p.created for p in singles if p.created is not None), default=None)
    last_bind = max((cast(float, p.bound) for p in bound_singles), default=None)
    span = (
        last_bind - first_arrival
        if first_arrival is not None and last_bind is not None
        else math.nan
    )
    stranded = sum(o.stranded_gpu_s for o in outcomes)

    def mean(values: Iterable[float]) -> float:
        seq = list(values)
        return sum(seq) / len(seq) if seq else math.nan

    summary = ArmSummary(
        arm=arm,
        gangs=len(outcomes),
        admitted=sum(1 for o in outcomes if o.admitted),
        partial=sum(1 for o in outcomes if o.partial),
        gave_up=sum(1 for o in outcomes if not o.admitted),
        tta_p50_s=percentile(tta, 50),
        tta_p99_s=percentile(tta, 99),
        stranded_gpu_s=stranded,
        avg_stranded_gpus=stranded / horizon if horizon > 0 else math.nan,
        pre_admit_gpu_s=sum(o.pre_admit_gpu_s for o in outcomes),
        gpu_util=mean(s.used / total_gpus for s in samples) if total_gpus else math.nan,
        fragmented_gpus=mean(s.fragmented for s in samples),
        free_gpus=mean(s.free for s in samples),
        empty_nodes=mean(s.empty_nodes for s in samples),
        singles=len(singles),
        singles_bound=len(bound_singles),
        singles_per_s=len(bound_singles) / span if span and span > 0 else math.nan,
        single_p50_s=percentile(latencies, 50),
        single_p99_s=percentile(latencies, 99),
        horizon_s=horizon,
        duration_s=duration,
        solve_rows=tuple(solve_by_size(solves)) if solves else (),
        metrics=dict(metrics or {}),
        partial_gauge_max=partial_gauge_max,
    )
    return summary, outcomes, samples


# --- report --------------------------------------------------------------------------------


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]


def _f(value: float | None, fmt: str = ".2f") -> str:
    if value is None or math.isnan(value):
        return "-"
    return format(value, fmt)


def _ms(seconds: float) -> str:
    return _f(seconds * 1000, ".0f")


def report_lines(summaries: Sequence[ArmSummary]) -> list[str]:
    """The printed tables: gangs, fleet, singles, solve time per size, Lattice's metrics."""
    lines = ["gangs:"]
    rows: list[Sequence[str]] = [
        (
            "arm",
            "gangs",
            "admitted",
            "gave up",
            "partial",
            "admit p50 s",
            "admit p99 s",
            "stranded GPU·s",
            "avg stranded GPUs",
            "pre-admit GPU·s",
        )
    ]
    for s in summaries:
        rows.append(
            (
                ARM_LABELS.get(s.arm, s.arm),
                str(s.gangs),
                str(s.admitted),
                str(s.gave_up),
                str(s.partial),
                _f(s.tta_p50_s),
                _f(s.tta_p99_s),
                _f(s.stranded_gpu_s, ".0f"),
                _f(s.avg_stranded_gpus, ".1f"),
                _f(s.pre_admit_gpu_s, ".1f"),
            )
        )
    lines += _table(rows)
    lines += ["", "fleet (sampled while arrivals last):"]
    rows = [("arm", "GPU util", "free GPUs", "fragmented free", "share of free", "empty nodes")]
    for s in summaries:
        share = s.fragmented_gpus / s.free_gpus if s.free_gpus else math.nan
        rows.append(
            (
                ARM_LABELS.get(s.arm, s.arm),
                _f(s.gpu_util * 100, ".1f") + " %",
                _f(s.free_gpus, ".1f"),
                _f(s.fragmented_gpus, ".1f"),
                _f(share * 100, ".0f") + " %",
                _f(s.empty_nodes, ".1f"),
            )
        )
    lines += _table(rows)
    lines += ["", "single GPU pods meanwhile:"]
    rows = [("arm", "singles", "offered/s", "bound", "pods/s", "bind p50 ms", "bind p99 ms")]
    for s in summaries:
        rows.append(
            (
                ARM_LABELS.get(s.arm, s.arm),
                str(s.singles),
                _f(s.singles / s.duration_s if s.duration_s > 0 else math.nan),
                str(s.singles_bound),
                _f(s.singles_per_s),
                _ms(s.single_p50_s),
                _ms(s.single_p99_s),
            )
        )
    lines += _table(rows)
    lattice = [s for s in summaries if s.arm != "kube"]
    if lattice:
        lines += ["", "solve time per gang size (Lattice's log, one line per attempt):"]
        rows = [("arm", "size", "attempts", "assumed", "timed", "p50 ms", "p99 ms", "max ms")]
        for s in lattice:
            for r in s.solve_rows:
                rows.append(
                    (
                        ARM_LABELS.get(s.arm, s.arm),
                        f"{r.sizes[0]}-{r.sizes[1]}",
                        str(r.attempts),
                        str(r.assumed),
                        str(r.timed),
                        _f(r.p50_ms, ".1f"),
                        _f(r.p99_ms, ".1f"),
                        _f(r.max_ms, ".1f"),
                    )
                )
            if not s.solve_rows:
                rows.append((ARM_LABELS.get(s.arm, s.arm), "-", "0", "0", "0", "-", "-", "-"))
        lines += _table(rows)
        if any(r.timed < r.attempts for s in lattice for r in s.solve_rows):
            lines.append(
                "(timed < attempts: those log lines had no duration_ms; the solve histogram "
                "below counts every attempt)"
            )
        lines += ["", "Lattice's /metrics at the end of each arm:"]
        for s in lattice:
            lines.append(f"  {ARM_LABELS.get(s.arm, s.arm)}: {metrics_line(s)}")
    return lines


def metrics_line(s: ArmSummary) -> str:
    m = s.metrics
    if not m:
        return "(not scraped)"
    outcomes = {
        k.split("outcome=", 1)[1].rstrip("}"): v
        for k, v in m.items()
        if k.startswith("lattice_gang_attempts_total{")
    }
    parts = ["attempts " + (", ".join(f"{k} {v:g}" for k, v in sorted(outcomes.items())) or "none")]
    count = m.get("lattice_gang_solve_duration_seconds_count")
    total = m.get("lattice_gang_solve_duration_seconds_sum")
    if count:
        parts.append(f"solve mean {1000 * (total or 0.0) / count:.1f} ms over {count:g}")
    count = m.get("lattice_gang_admit_duration_seconds_count")
    total = m.get("lattice_gang_admit_duration_seconds_sum")
    if count:
        parts.append(f"quorum-to-bound mean {(total or 0.0) / count:.2f} s over {count:g}")
    if "lattice_gang_partial_gangs" in m:
        parts.append(f"gangs_partial at end {m['lattice_gang_partial_gangs']:g}")
    if s.partial_gauge_max is not None:
        parts.append(f"max seen {s.partial_gauge_max:g}")
    return "; ".join(parts)


def verdict_lines(summaries: Sequence[ArmSummary]) -> list[str]:
    """The issue's targets, reported (never asserted)."""
    by = {s.arm: s for s in summaries}
    out = []
    if "cpsat" in by and "greedy" in by:
        c, g = by["cpsat"], by["greedy"]
        word = "more" if c.admitted > g.admitted else "not more"
        out.append(
            f"target: CP-SAT admits more gangs than greedy on the same stream: {c.admitted} vs "
            f"{g.admitted} ({word})"
        )
    for arm in ("cpsat", "greedy"):
        if arm in by:
            out.append(f"target: 0 partial gangs ({ARM_LABELS[arm]}): {by[arm].partial}")
    if "kube" in by:
        k = by["kube"]
        out.append(
            f"kube-scheduler: {k.partial} partial gangs holding {k.stranded_gpu_s:.0f} GPU·s "
            f"(avg {k.avg_stranded_gpus:.1f} GPUs stranded over {k.horizon_s:.0f} s)"
        )
    return out


# --- the scaling row (pure solver) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScalingRow:
    nodes: int
    solver: str
    """``CPSAT`` or ``Greedy`` (the greedy plan alone, as ``spec.gang.solver: Greedy``)."""
    members: int
    gpus: int
    status: str
    admitted: bool
    placed: int
    solve_s: float
    """Median over the repeats."""
    solve_max_s: float
    build_s: float
    """Median over the repeats of ``build_problem`` (framework per member class)."""
    variables: int
    repeats: int


def occupancy(nodes: int, seed: int) -> list[int]:
    """GPUs already used per node for the scaling row: uniform 0-8, so about half the fleet
    is busy and most nodes are partly used (the fragmentation the objective works against)."""
    rng = np.random.default_rng([seed, 3])
    return [int(k) for k in rng.integers(0, GPUS_PER_NODE + 1, size=nodes)]


def scaling_rows(
    sizes: Sequence[int],
    *,
    members: int,
    gpus: int,
    seed: int,
    time_limit_s: float,
    repeats: int = 3,
) -> list[ScalingRow] | str:
    """Rows from ``scheduler.solver``; or why there are none (the solver is missing).

    Each row builds and solves ``repeats`` times on the same snapshot (the first build also
    pays one-off costs, so the median is the figure); status is the last solve's, all
    statuses joined by ``/`` when they differed."""
    try:
        from scheduler.solver import build_problem, solve
    except ImportError as exc:
        return f"scaling row not run: it needs scheduler.solver, which is not importable ({exc})"
    from lattice_dev.devcluster.agents import fixture_for_profile, read_fixture
    from lattice_dev.devcluster.profiles import get_profile, node_name
    from scheduler.core.profile import DEFAULT_PROFILE
    from scheduler.core.schedule import Framework
    from scheduler.core.snapshot import Snapshot
    from scheduler.core.topology import DEVICES_ANNOTATION, DeviceAssignment, TopologyState
    from scheduler.model.gang import GangSpec
    from scheduler.model.node import Node
    from scheduler.model.pod import Pod

    fixture = fixture_for_profile("gpu-8x")
    assert fixture is not None
    hardware = read_fixture(fixture).topology
    profile = get_profile("gpu-8x")
    framework = Framework(DEFAULT_PROFILE)

    def pod(name: str, k: int, gang: str | None) -> Pod:
        body = pod_body(name, k, LATTICE, gang)
        body["metadata"].update(namespace="bench", uid=f"uid-{name}")
        return Pod.from_api(body)

    rows = []
    for n in sizes:
        names = [node_name(i) for i in range(n)]
        snapshot = Snapshot([Node.from_api(profile.node_body(x, i)) for i, x in enumerate(names)])
        state = TopologyState(DEFAULT_PROFILE.topology)
        for x in names:
            state.set_node_topology(x, hardware)
        for x, used in zip(names, occupancy(n, seed), strict=True):
            if used == 0:
                continue
            busy = pod(f"busy-{x}", used, None)
            layout = state.layout(x)
            assert layout is not None
            devices = tuple(i for i in layout.gpu_index[:used] if i is not None)
            zones = {int(z) for z in layout.gpu_zone[:used]}
            numa = layout.numa_ids[zones.pop()] if len(zones) == 1 else None
            snapshot.add_pod(busy, x)
            state.pod_placed(
                busy, x, {DEVICES_ANNOTATION: DeviceAssignment(devices, (), numa).to_annotation()}
            )
        spec = GangSpec(namespace="bench", name="scale", min_member=members)
        gang = [pod(f"scale-{i:02d}", gpus, "scale") for i in range(members)]
        for use_solver in (True, False):
            builds, solves, statuses = [], [], []
            for _ in range(max(repeats, 1)):
                started = time.perf_counter()
                problem = build_problem(
                    framework, snapshot, spec, gang, need=members, topology=state, seed=seed
                )
                builds.append(time.perf_counter() - started)
                plan = solve(problem, time_limit_s=time_limit_s, seed=seed, use_solver=use_solver)
                solves.append(plan.solve_time_s)
                if plan.status.value not in statuses:
                    statuses.append(plan.status.value)
            rows.append(
                ScalingRow(
                    nodes=n,
                    solver="CPSAT" if use_solver else "Greedy",
                    members=members,
                    gpus=gpus,
                    status="/".join(statuses),
                    admitted=plan.admitted,
                    placed=plan.placed,
                    solve_s=percentile(solves, 50),
                    solve_max_s=max(solves),
                    build_s=percentile(builds, 50),
                    variables=plan.variables,
                    repeats=len(solves),
                )
            )
    return rows


def scaling_lines(rows: Sequence[ScalingRow] | str) -> list[str]:
    if isinstance(rows, str):
        return [rows]
    table: list[Sequence[str]] = [
        (
            "nodes",
            "solver",
            "members",
            "GPUs each",
            "status",
            "admitted",
            "placed",
            "solve s (median)",
            "max",
            "build s",
        )
    ]
    for r in rows:
        table.append(
            (
                str(r.nodes),
                r.solver,
                str(r.members),
                str(r.gpus),
                r.status,
                "yes" if r.admitted else "no",
                str(r.placed),
                f"{r.solve_s:.3f}",
                f"{r.solve_max_s:.3f}",
                f"{r.build_s:.3f}",
            )
        )
    out = _table(table)
    if rows:
        out.append(
            f"(median and max of {rows[0].repeats} solves each; build: build_problem, the "
            "framework once per member class, on the event loop before the solve)"
        )
    for r in rows:
        if r.nodes == 1000 and r.solver == "CPSAT":
            ok = "met" if r.solve_max_s <= 1.0 else "missed"
            out.append(
                f"target: solve <= 1 s at 1000 nodes: max {r.solve_max_s:.3f} s ({ok}), "
                f"admitted: {'yes' if r.admitted else 'no'}"
            )
    return out


# --- the cluster side ----------------------------------------------------------------------


class PodWatch:
    """Fills the arm's :class:`PodRecord` s from one raw watch: first binding and deletion."""

    def __init__(
        self, api: client.ApiClient, ns: str, records: Mapping[str, PodRecord], t0: float
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.ns = ns
        self.records = records
        self.t0 = t0
        self.started = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        rv = "0"
        while True:
            resp: Any = await self.core.list_namespaced_pod(
                self.ns,
                watch=True,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=900,
                _preload_content=False,
            )
            self.started.set()
            async for line in resp.content:
                ev = json.loads(line)
                if ev.get("type") == "ERROR":
                    rv = "0"  # expired: start over; a binding is recorded once anyway
                    break
                obj = ev["object"]
                meta = obj.get("metadata", {})
                rv = meta.get("resourceVersion", rv)
                rec = self.records.get(meta.get("name", ""))
                if rec is None:
                    continue
                now = time.monotonic() - self.t0
                node = obj.get("spec", {}).get("nodeName")
                if node and rec.bound is None:
                    rec.bound, rec.node = now, node
                if ev.get("type") == "DELETED" and rec.gone is None:
                    rec.gone = now

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def pod_body(name: str, gpus: int, scheduler: str, gang: str | None) -> dict[str, Any]:
    requests = {"cpu": str(CPU_PER_GPU * gpus), "memory": f"{MEM_GI_PER_GPU * gpus}Gi"}
    labels = {"app": "bench-gang"}
    if gang is not None:
        labels[POD_GROUP_LABEL] = gang
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {
                        "requests": {**requests, GPU: str(gpus)},
                        "limits": {GPU: str(gpus)},
                    },
                }
            ],
        },
    }


def podgroup_body(name: str, min_member: int, timeout_s: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{PG_GROUP}/{PG_VERSION}",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"minMember": min_member, "scheduleTimeoutSeconds": timeout_s},
    }


def gang_spec(arm: str, time_limit_s: float) -> dict[str, Any]:
    """``spec.gang`` of the LatticeScheduler object for a Lattice arm."""
    return {
        "solver": "Greedy" if arm == "greedy" else "CPSAT",
        "solverTimeLimitSeconds": time_limit_s,
    }


def serving_port(lines: Iterable[str]) -> int | None:
    """The metrics port from Lattice's ``serving`` log line."""
    for line in lines:
        if '"serving"' not in line:
            continue
        match = re.search(r"metrics on [^\s:]+:(\d+)", line)
        if match:
            return int(match.group(1))
    return None


def _read_from(path: Path, offset: int) -> list[str]:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace").splitlines()
    except FileNotFoundError:
        return []


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return cast(bytes, resp.read()).decode()


@dataclass
class ArmResult:
    summary: ArmSummary
    outcomes: list[GangOutcome]
    samples: list[FleetSample]
    pods: dict[str, PodRecord]
    windows: list[GangWindow]
    late_starts: float
    """Largest lag of an arrival behind its planned time, s (the benchmark's own pacing)."""
    problems: list[str] = field(default_factory=list)
    """What went wrong on the benchmark's side (API errors, a scheduler that exited)."""


class GangBench:
    def __init__(
        self,
        cluster: DevCluster,
        api: client.ApiClient,
        stream: Sequence[Arrival],
        node_gpus: Mapping[str, int],
        args: argparse.Namespace,
    ) -> None:
        self.cluster = cluster
        self.api = api
        self.core = client.CoreV1Api(api)
        self.objects: Any = client.CustomObjectsApi(api)
        self.stream = list(stream)
        self.node_gpus = dict(node_gpus)
        self.args = args
        self.sizes = gang_sizes(stream)

    async def run_arm(self, index: int, arm: ArmName) -> ArmResult:
        args = self.args
        ns = f"bench-gang-{index}-{arm}"
        await self.core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": ns}}))
        log_offset = self._log_size()
        port = await self._start_scheduler(arm, log_offset)
        scheduler = KUBE_SCHEDULER if arm == "kube" else LATTICE
        records: dict[str, PodRecord] = {}
        windows: list[GangWindow] = []
        for a in self.stream:
            if isinstance(a, GangArrival):
                for m, g in zip(a.member_names(), a.member_gpus, strict=True):
                    records[m] = PodRecord(m, g, gang=a.name)
                windows.append(GangWindow(a.name, a.member_names()))
            else:
                records[a.name] = PodRecord(a.name, a.gpus)
        by_gang = {w.name: w for w in windows}
        t0 = time.monotonic() + 1.0
        watch = PodWatch(self.api, ns, records, t0)
        watch.start()
        await watch.started.wait()
        lags: list[float] = []
        gauge_max: list[float] = []
        stop_gauge = asyncio.Event()
        gauge = (
            asyncio.create_task(self._watch_gauge(port, gauge_max, stop_gauge))
            if port is not None
            else None
        )
        tasks = [
            asyncio.create_task(
                self._gang(ns, scheduler, a, t0, records, by_gang[a.name], lags)
                if isinstance(a, GangArrival)
                else self._single(ns, scheduler, a, t0, records, lags)
            )
            for a in self.stream
        ]
        horizon = args.duration + args.patience + 2.0
        await asyncio.wait(tasks, timeout=max(t0 + horizon - time.monotonic(), 0.0))
        ended = time.monotonic() - t0
        metrics: dict[str, float] = {}
        if port is not None:  # before the clean-up below deletes running gangs
            with contextlib.suppress(OSError):
                metrics = parse_metrics(await asyncio.to_thread(_scrape, port))
            stop_gauge.set()
            if gauge is not None:
                await gauge
        for task in tasks:
            task.cancel()
        outcomes_of_tasks = await asyncio.gather(*tasks, return_exceptions=True)
        problems = [
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            for exc in outcomes_of_tasks
            if isinstance(exc, Exception)
        ]
        component = "kube-scheduler" if arm == "kube" else LATTICE
        if not self.cluster.running().get(component, False):
            problems.append(f"{component} was not running at the end of the arm")
        self.cluster.stop_component(component)
        solves = (
            parse_solve_lines(_read_from(self.cluster.log(LATTICE), log_offset), self.sizes)
            if arm != "kube"
            else []
        )
        await self._clear(ns)
        await watch.stop()
        summary, outcomes, samples = summarize(
            arm,
            pods=records,
            windows=windows,
            node_gpus=self.node_gpus,
            horizon=ended,
            duration=args.duration,
            sample_interval=args.sample_interval,
            solves=solves,
            metrics=metrics,
            partial_gauge_max=max(gauge_max) if gauge_max else None,
        )
        return ArmResult(
            summary, outcomes, samples, records, windows, max(lags, default=0.0), problems
        )

    async def _sleep_until(self, t0: float, at: float, lags: list[float]) -> None:
        delay = t0 + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            lags.append(-delay)

    async def _create_pod(self, ns: str, body: dict[str, Any], rec: PodRecord, t0: float) -> None:
        await self.core.create_namespaced_pod(ns, cast(client.V1Pod, body))
        rec.created = time.monotonic() - t0

    async def _delete_pod(self, ns: str, rec: PodRecord, t0: float) -> None:
        rec.deleted = time.monotonic() - t0
        with contextlib.suppress(ApiException):
            await self.core.delete_namespaced_pod(rec.name, ns, grace_period_seconds=0)

    async def _wait_bound(self, recs: Sequence[PodRecord], until: float) -> bool:
        while time.monotonic() < until:
            if all(r.bound is not None for r in recs):
                return True
            await asyncio.sleep(POLL_S)
        return all(r.bound is not None for r in recs)

    async def _gang(
        self,
        ns: str,
        scheduler: str,
        a: GangArrival,
        t0: float,
        records: Mapping[str, PodRecord],
        window: GangWindow,
        lags: list[float],
    ) -> None:
        """One gang's life: PodGroup and members, wait for admission, run, delete."""
        await self._sleep_until(t0, a.at, lags)
        recs = [records[m] for m in a.member_names()]
        try:
            await self.objects.create_namespaced_custom_object(
                PG_GROUP,
                PG_VERSION,
                ns,
                PG_PLURAL,
                podgroup_body(a.name, a.members, math.ceil(self.args.patience)),
            )
            await asyncio.gather(
                *(
                    self._create_pod(ns, pod_body(r.name, r.gpus, scheduler, a.name), r, t0)
                    for r in recs
                )
            )
            window.opened = max(cast(float, r.created) for r in recs)
            admitted = await self._wait_bound(recs, t0 + window.opened + self.args.patience)
            if admitted:
                await asyncio.sleep(a.lifetime_s)
        finally:
            if window.opened is not None:
                window.closed = time.monotonic() - t0
            await asyncio.shield(self._delete_gang(ns, a.name, recs, t0))

    async def _delete_gang(self, ns: str, name: str, recs: Sequence[PodRecord], t0: float) -> None:
        """PodGroup first: a gang whose members go while its PodGroup stays looks partly
        bound to Lattice for a moment (and would show in ``lattice_gang_partial_gangs``)."""
        with contextlib.suppress(ApiException):
            await self.objects.delete_namespaced_custom_object(
                PG_GROUP, PG_VERSION, ns, PG_PLURAL, name
            )
        await asyncio.gather(*(self._delete_pod(ns, r, t0) for r in recs))

    async def _single(
        self,
        ns: str,
        scheduler: str,
        a: SingleArrival,
        t0: float,
        records: Mapping[str, PodRecord],
        lags: list[float],
    ) -> None:
        await self._sleep_until(t0, a.at, lags)
        rec = records[a.name]
        try:
            await self._create_pod(ns, pod_body(a.name, a.gpus, scheduler, None), rec, t0)
            bound = await self._wait_bound([rec], time.monotonic() + self.args.patience)
            if bound:
                await asyncio.sleep(a.lifetime_s)
        finally:
            if rec.created is not None:
                await asyncio.shield(self._delete_pod(ns, rec, t0))

    async def _watch_gauge(self, port: int, seen: list[float], stop: asyncio.Event) -> None:
        """Samples ``lattice_gang_partial_gangs`` every 2 s: a partial gang may heal later."""
        while not stop.is_set():
            with contextlib.suppress(OSError):
                text = await asyncio.to_thread(_scrape, port)
                value = parse_metrics(text).get("lattice_gang_partial_gangs")
                if value is not None:
                    seen.append(value)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=2.0)

    # -- schedulers and cleanup ---------------------------------------------------------------

    def _log_size(self) -> int:
        path = self.cluster.log(LATTICE)
        return path.stat().st_size if path.exists() else 0

    async def _start_scheduler(self, arm: ArmName, log_offset: int) -> int | None:
        """Start the arm's scheduler; for Lattice, its metrics port once it is Ready."""
        if arm == "kube":
            self.cluster.start_kube_scheduler(
                ClusterConfig(percentage_of_nodes_to_score=100 if self.args.score_all else None)
            )
            return None
        await self._apply_gang_spec(gang_spec(arm, self.args.solver_time_limit))
        precompile_lattice()
        started = time.time()
        self.cluster.start_process(
            LATTICE,
            [
                sys.executable,
                "-m",
                "scheduler.cli",
                "run",
                f"--kubeconfig={self.cluster.kubeconfig}",
                "--no-leader-elect",
                "--metrics-host=127.0.0.1",
                "--metrics-port=0",
                # info: the solve-time lines and the serving line (metrics port) are info
                "--log-level=info",
            ],
            marker="scheduler.cli",
        )
        await wait_lattice_ready(self.objects, started)
        return serving_port(_read_from(self.cluster.log(LATTICE), log_offset))

    async def _apply_gang_spec(self, gang: dict[str, Any]) -> None:
        try:
            await self.objects.get_cluster_custom_object(LS_GROUP, LS_VERSION, LS_PLURAL, LATTICE)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": f"{LS_GROUP}/{LS_VERSION}",
                "kind": "LatticeScheduler",
                "metadata": {"name": LATTICE},
                "spec": {"schedulerName": LATTICE, "gang": gang},
            }
            await self.objects.create_cluster_custom_object(LS_GROUP, LS_VERSION, LS_PLURAL, body)
            return
        await self.objects.patch_cluster_custom_object(
            LS_GROUP,
            LS_VERSION,
            LS_PLURAL,
            LATTICE,
            [{"op": "add", "path": "/spec/gang", "value": gang}],
        )

    async def _clear(self, ns: str) -> None:
        """Force-delete what is left of the arm, so the next one starts on an empty fleet."""
        await self.core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        with contextlib.suppress(ApiException):
            await self.objects.delete_collection_namespaced_custom_object(
                PG_GROUP, PG_VERSION, ns, PG_PLURAL
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pods = await self.core.list_namespaced_pod(ns)
            if not pods.items:
                break
            await asyncio.sleep(0.5)
        with contextlib.suppress(ApiException):
            await self.core.delete_namespace(ns)


async def _node_gpus(api: client.ApiClient) -> dict[str, int]:
    core = client.CoreV1Api(api)
    resp: Any = await core.list_node(_preload_content=False)
    out = {}
    for item in json.loads(await resp.read())["items"]:
        alloc = item.get("status", {}).get("allocatable", {})
        out[item["metadata"]["name"]] = int(alloc.get(GPU, "0"))
    return out


def stream_lines(stream: Sequence[Arrival], config: StreamConfig, total_gpus: int) -> list[str]:
    gangs = [a for a in stream if isinstance(a, GangArrival)]
    singles = [a for a in stream if isinstance(a, SingleArrival)]
    demand = sum(sum(g.member_gpus) * g.lifetime_s for g in gangs) + sum(
        s.gpus * s.lifetime_s for s in singles
    )
    offered = demand / (config.duration_s * total_gpus) if total_gpus else math.nan
    sizes = [g.members for g in gangs]
    return [
        f"stream: {len(gangs)} gangs ({min(sizes, default=0)}-{max(sizes, default=0)} members, "
        f"{config.gang_gpus[0]}-{config.gang_gpus[1]} GPUs each, "
        f"{sum(1 for g in gangs if g.mixed)} mixed, "
        f"{sum(sum(g.member_gpus) for g in gangs)} GPUs in all, lifetime "
        f"{config.gang_lifetime_s[0]:g}-{config.gang_lifetime_s[1]:g} s) and {len(singles)} "
        f"single pods ({config.single_gpus[0]}-{config.single_gpus[1]} GPUs, lifetime "
        f"{config.single_lifetime_s[0]:g}-{config.single_lifetime_s[1]:g} s) over "
        f"{config.duration_s:g} s; offered GPU·s / fleet GPU·s = {offered:.2f}",
    ]


def json_safe(value: Any) -> Any:
    """NaN (an empty percentile) as null, so the dump is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def dump(
    stream: Sequence[Arrival],
    results: Mapping[str, ArmResult],
    scaling: Sequence[ScalingRow] | str,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The raw results, JSON-ready."""
    raw = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "stream": [
            {"kind": "gang" if isinstance(a, GangArrival) else "single", **asdict(a)}
            for a in stream
        ],
        "arms": {
            arm: {
                "summary": asdict(r.summary),
                "lateStartMaxS": r.late_starts,
                "problems": r.problems,
                "gangs": [asdict(o) for o in r.outcomes],
                "windows": [asdict(w) for w in r.windows],
                "pods": [asdict(p) for p in r.pods.values()],
                "fleet": [asdict(s) for s in r.samples],
            }
            for arm, r in results.items()
        },
        "scaling": scaling if isinstance(scaling, str) else [asdict(r) for r in scaling],
    }
    return cast(dict[str, Any], json_safe(raw))


async def _bench(
    cluster: DevCluster, stream: Sequence[Arrival], config: StreamConfig, args: argparse.Namespace
) -> tuple[list[str], dict[str, ArmResult]]:
    async with api_client(cluster.kubeconfig) as api:
        node_gpus = await _node_gpus(api)
        header = [
            f"{len(node_gpus)} kwok nodes ({args.node_profile}: {sum(node_gpus.values())} GPUs); "
            f"patience {args.patience:g} s; seed {args.seed}; solver time limit "
            f"{args.solver_time_limit:g} s",
            *stream_lines(stream, config, sum(node_gpus.values())),
        ]
        print(*header, sep="\n", flush=True)
        bench = GangBench(cluster, api, stream, node_gpus, args)
        results: dict[str, ArmResult] = {}
        for i, arm in enumerate(args.arms):
            started = time.monotonic()
            r = await bench.run_arm(i, arm)
            results[arm] = r
            s = r.summary
            print(
                f"{ARM_LABELS[arm]:>16}: admitted {s.admitted}/{s.gangs}, partial {s.partial}, "
                f"singles bound {s.singles_bound}/{s.singles}, pacing lag max "
                f"{r.late_starts:.2f} s, problems {len(r.problems)} "
                f"[{time.monotonic() - started:.0f}s]",
                flush=True,
            )
            for problem in sorted(set(r.problems)):
                print(f"    {problem} (x{r.problems.count(problem)})", flush=True)
    return header, results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--node-profile", default="gpu-8x", help="devcluster node profile")
    parser.add_argument("--gangs", type=int, default=48, help="gangs in the stream")
    parser.add_argument("--singles", type=int, default=200, help="single GPU pods in the stream")
    parser.add_argument(
        "--duration",
        type=float,
        default=120.0,
        help="arrivals span, s (rates: gangs and singles / duration)",
    )
    parser.add_argument(
        "--patience", type=float, default=30.0, help="s a gang or single may wait to be bound"
    )
    parser.add_argument(
        "--mixed-share",
        type=float,
        default=0.5,
        help="share of gangs whose members ask different GPU counts",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--arms",
        nargs="*",
        choices=ARMS,
        default=list(ARMS),
        help="arms to run, in this order (none: only the scaling row, no cluster)",
    )
    parser.add_argument("--solver-time-limit", type=float, default=1.0, help="CP-SAT budget, s")
    parser.add_argument("--sample-interval", type=float, default=1.0, help="fleet sampling, s")
    parser.add_argument(
        "--scaling-nodes",
        type=int,
        nargs="*",
        default=[1000, 5000],
        help="node counts of the pure-solver scaling row (none: skip it)",
    )
    parser.add_argument("--scaling-members", type=int, default=64)
    parser.add_argument("--scaling-gpus", type=int, default=4, help="GPUs per scaling member")
    parser.add_argument("--scaling-repeats", type=int, default=3, help="solves per scaling row")
    parser.add_argument("--json", type=Path, default=None, help="write raw results here")
    parser.add_argument(
        "--score-all",
        action="store_true",
        help="kube-scheduler scores every node (percentageOfNodesToScore 100), a tuned peer; "
        "default: its adaptive default, as its users run it",
    )
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.duration <= 0 or args.patience <= 0 or args.gangs < 0:
        parser.error("need --nodes >= 1, --duration > 0, --patience > 0, --gangs >= 0")
    if not 0 < args.solver_time_limit <= 60:
        parser.error("--solver-time-limit must be in (0, 60]")
    if not 0 <= args.mixed_share <= 1:
        parser.error("--mixed-share must be in [0, 1]")
    config = StreamConfig(
        gangs=args.gangs,
        singles=args.singles,
        duration_s=args.duration,
        mixed_share=args.mixed_share,
    )
    stream = generate_stream(args.seed, config)
    started = time.monotonic()
    header: list[str] = []
    results: dict[str, ArmResult] = {}
    if args.arms:
        scratch = Path(tempfile.mkdtemp(prefix="lattice-bench-gang-"))
        cluster = DevCluster(scratch / "state")
        try:
            state = cluster.up(
                ClusterConfig(
                    nodes=args.nodes, node_profile=args.node_profile, node_ready_timeout=600
                )
            )
            apply_crds(cluster, state)
            print(
                f"control plane with {args.nodes} kwok nodes ready in "
                f"{time.monotonic() - started:.0f}s",
                flush=True,
            )
            header, results = asyncio.run(_bench(cluster, stream, config, args))
        finally:
            cluster.down()
            shutil.rmtree(scratch, ignore_errors=True)
    scaling: list[ScalingRow] | str = []
    if args.scaling_nodes:
        print("scaling row: pure solver ...", flush=True)
        scaling = scaling_rows(
            args.scaling_nodes,
            members=args.scaling_members,
            gpus=args.scaling_gpus,
            seed=args.seed,
            time_limit_s=args.solver_time_limit,
            repeats=args.scaling_repeats,
        )
    summaries = [r.summary for r in results.values()]
    lines = [*header, ""]
    if summaries:
        lines += [*report_lines(summaries), "", *verdict_lines(summaries), ""]
        for arm, r in results.items():
            if r.problems:
                lines.append(
                    f"warning: {ARM_LABELS[arm]} had {len(r.problems)} problems on the "
                    f"benchmark's side, e.g. {r.problems[0]} (all in --json)"
                )
    if args.scaling_nodes:
        lines += [
            f"scaling (pure solver, one {args.scaling_members}-member gang, "
            f"{args.scaling_gpus} GPUs each, time limit {args.solver_time_limit:g} s):",
            *scaling_lines(scaling),
            "",
        ]
    if summaries:
        lines.append(
            "stranded: GPU·s held by bound members of gangs whose window closed partial "
            "(integrated over time); fleet figures sampled every "
            f"{args.sample_interval:g} s while arrivals last; see --help for every definition."
        )
    print()
    print("\n".join(lines))
    if args.json is not None:
        args.json.write_text(
            json.dumps(dump(stream, results, scaling, args), indent=1, allow_nan=False)
        )
        print(f"raw results: {args.json}")
    print(f"\n(total {time.monotonic() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Lattice beside kube-scheduler on one control plane: throughput, CPU, memory, latency.

For each workload, each repeat and each scheduler, on the same kwok cluster,
with equal client QPS/burst (``--qps``/``--burst``: kube-scheduler's
clientConnection, Lattice's LatticeScheduler ``clientQPS``/``clientBurst``).
kube-scheduler runs as its users run it: its adaptive ``percentageOfNodesToScore``
(about a third of 2000 nodes, a tenth of 5000; Lattice always scores all);
``--score-all`` gives the tuned peer (percentageOfNodesToScore 100), a second row to
print labelled, never the headline:

* scale mode (``--existing N``): N pods of the workload's own shape are already
  bound when the scheduler starts. They are created pre-bound (``spec.nodeName``)
  rather than placed by kube-scheduler: both schedulers then face the very same
  placement, setting up 30 000 pods takes a minute instead of a scheduler run of
  its own, and the placement is chosen to satisfy every workload (zones exactly
  balanced, hosts as even as the count allows, at most one pod per node for
  anti-affinity, which caps N there). kwok runs them before the clock starts.
* throughput: the measured pods are created while no scheduler runs, then a
  fresh scheduler process starts; pods/s = (bound - 1) / (last binding - first
  binding) as seen by the benchmark's watch, so start-up and sync are excluded;
* the floor (``null-binder``, a third row unless ``--no-floor``): a Go program on
  client-go (``e2e/controlplane/cmd/nullbinder``, built per release into a cache
  folder of its own) that lists and watches the pending pods of its schedulerName and
  POSTs one ``pods/binding`` per pod, round-robin over the nodes, nothing else, at the
  same client QPS/burst and at most ``--floor-in-flight`` bindings outstanding. It
  faces the same parked backlog in its own namespace; each scheduler's pods/s is also
  given as a fraction of the floor's in the same repeat ("of floor"): what the API
  server and etcd on this machine let any binder reach;
* CPU per pod, two figures: "window", the process's CPU seconds (``/proc/<pid>/stat``,
  user + system) between the first and the last of those bindings, per pod bound in
  between (start-up and sync left out); and "whole", the process's CPU seconds from
  its start to the last binding, per pod bound: what a user pays for the whole
  process on this backlog (start-up, informer sync, then the binding);
  CPU s is the whole run's (stream included); peak RSS is ``VmHWM`` of ``/proc/<pid>/status``;
  "plane ms/pod" is kube-apiserver + etcd CPU over the same span, per pod: what
  each scheduler's reads and writes cost the API server both share;
* latency: with the scheduler running, a stream of pods at a fixed rate; p50/p99
  from the client's create call to the watch showing the binding.

Each (workload, repeat, scheduler) has its own namespace, deleted afterwards so
the next one starts on the same cluster; the order of the schedulers rotates
between repeats (with 3 repeats each runs once first, once second, once third).
At the end, per workload and scheduler: min / median / max over the repeats of
pods/s, its ratio to kube-scheduler's and its fraction of the floor's (both per
repeat), and both CPU-per-pod figures. ``--repeat K`` prints every figure: on a shared
2-core machine the ratios move by 2x from one run to the next. Every figure
says how many pods it covers ("bound N/M") and warns when the benchmark's own
watch had to re-list (those pods' times are the re-list's). Run: `just bench`
(or `python -m lattice_dev.benchmarks.scheduling --help`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import aiohttp
import numpy as np
from kubernetes_asyncio import client

from lattice_dev.benchmarks.common import Watcher, apply_crds, start_lattice
from lattice_dev.benchmarks.common import create_pods as _create
from lattice_dev.benchmarks.common import wait_all as _wait_all
from lattice_dev.devcluster import pki
from lattice_dev.devcluster.build import ensure_null_binder, kubernetes_version
from lattice_dev.devcluster.cluster import ClusterConfig, DevCluster
from lattice_dev.devcluster.kube import api_client
from lattice_dev.devcluster.profiles import ZONES, node_name

CLK_TCK = os.sysconf("SC_CLK_TCK")
KUBE, LATTICE, NULL = "kube-scheduler", "lattice", "null-binder"
SIDES = (KUBE, LATTICE)
"""The two schedulers compared; :data:`NULL`, the floor, runs beside them unless --no-floor."""
SCHEDULER_NAMES = {KUBE: "default-scheduler", LATTICE: LATTICE, NULL: NULL}
"""The pods' spec.schedulerName for each row."""
COMPONENTS = {KUBE: "kube-scheduler", LATTICE: LATTICE, NULL: NULL}
"""The devcluster's name for each row's process (what stop_component stops)."""
NAMESPACE_SUFFIX = {KUBE: "kube", LATTICE: "lattice", NULL: "null"}
LS_GROUP, LS_VERSION, LS_PLURAL = "lattice.dev", "v1alpha1", "latticeschedulers"

PodMaker = Callable[[str, str], dict[str, Any]]


def _pod(name: str, scheduler: str, app: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                }
            ],
            **spec,
        },
    }


def _term(app: str, key: str) -> dict[str, Any]:
    return {"topologyKey": key, "labelSelector": {"matchLabels": {"app": app}}}


HOST, ZONE = "kubernetes.io/hostname", "topology.kubernetes.io/zone"


def plain(name: str, scheduler: str) -> dict[str, Any]:
    return _pod(name, scheduler, "plain")


def anti_affinity(name: str, scheduler: str) -> dict[str, Any]:
    """Required anti-affinity by hostname: one pod of the app per node."""
    return _pod(
        name,
        scheduler,
        "anti",
        affinity={
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [_term("anti", HOST)]
            }
        },
    )


def required_affinity(name: str, scheduler: str) -> dict[str, Any]:
    """Required affinity by zone: into a zone that already has a pod of the app."""
    return _pod(
        name,
        scheduler,
        "req",
        affinity={
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [_term("req", ZONE)]}
        },
    )


def preferred_affinity(name: str, scheduler: str) -> dict[str, Any]:
    """Preferred affinity by zone and preferred anti-affinity by hostname: scores only."""
    return _pod(
        name,
        scheduler,
        "pref",
        affinity={
            "podAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "podAffinityTerm": _term("pref", ZONE)}
                ]
            },
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 50, "podAffinityTerm": _term("pref", HOST)}
                ]
            },
        },
    )


def spread(name: str, scheduler: str) -> dict[str, Any]:
    """Zone spread, maxSkew 1, DoNotSchedule."""
    return _pod(
        name,
        scheduler,
        "spread",
        topologySpreadConstraints=[
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "spread"}},
            }
        ],
    )


WORKLOADS: dict[str, PodMaker] = {
    "plain": plain,
    "anti-affinity": anti_affinity,
    "required-affinity": required_affinity,
    "preferred-affinity": preferred_affinity,
    "topology-spread": spread,
}


# -- the setup: pure ---------------------------------------------------------------


def existing_node_index(i: int, nodes: int) -> int:
    """Where the i-th existing pod goes: zones take turns (node k is in zone k % 3,
    as the kwok profiles label them), and within a zone the nodes do; so zone
    counts never differ by more than one, and the first ``nodes`` pods each get
    a node of their own (pod i on node i)."""
    zones = len(ZONES)
    if nodes < zones:
        return i % nodes
    z = i % zones
    in_zone = (nodes - z + zones - 1) // zones
    return ((i // zones) % in_zone) * zones + z


@dataclass(frozen=True)
class Sizes:
    """How many pods one workload measures, streams and finds already bound; notes
    say why a figure differs from what was asked."""

    measured: int
    stream: int
    existing: int
    notes: tuple[str, ...] = ()


def sizes(workload: str, *, nodes: int, pods: int, stream: int, existing: int) -> Sizes:
    """Anti-affinity by hostname fits one pod per node: the measured pods first,
    then the latency stream, then as many existing pods as the rest of the nodes hold."""
    if workload != "anti-affinity":
        return Sizes(pods, stream, existing)
    measured = min(pods, nodes)
    streamed = min(stream, nodes - measured)
    kept = min(existing, nodes - measured - streamed)
    notes = [
        f"{what} capped at {got} (one per node)"
        for what, got, asked in (
            ("measured pods", measured, pods),
            ("stream", streamed, stream),
            ("existing pods", kept, existing),
        )
        if got < asked
    ]
    return Sizes(measured, streamed, kept, tuple(notes))


# -- results: pure -----------------------------------------------------------------


@dataclass
class Result:
    workload: str
    scheduler: str
    run: int
    pods: int
    """Measured pods created before the scheduler started."""
    bound: int
    existing: int
    pods_per_s: float
    cpu_ms_per_pod: float
    """CPU between the first and the last measured binding, per pod bound in between."""
    cpu_s: float
    """CPU of the whole process life (start-up, sync, backlog, stream)."""
    rss_mib: float
    cpu_whole_ms_per_pod: float = math.nan
    """CPU of the process from its start to the last measured binding, per pod bound:
    start-up and sync included, as a user pays them (see :func:`whole_cpu_ms_per_pod`)."""
    plane_ms_per_pod: float = math.nan
    """kube-apiserver + etcd CPU over the same span, per pod: what this scheduler's
    reads and writes cost the shared API server (on one machine, its limit)."""
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    stream: int = 0
    stream_bound: int = 0
    resumes: int = 0
    relists: int = 0
    relisted: int = 0
    """Measured pods first seen by a re-list: timed at the re-list, not their binding."""
    notes: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.bound == self.pods and self.stream_bound == self.stream


def ratio(num: float, den: float) -> float:
    """num / den, NaN when either is missing or the denominator is not positive."""
    if math.isnan(num) or math.isnan(den) or den <= 0:
        return math.nan
    return num / den


def whole_cpu_ms_per_pod(cpu_s_at_last_binding: float, bound: int) -> float:
    """The whole process's CPU per pod, in ms: the CPU seconds it had used when the last
    measured pod was bound (start-up, sync and binding; its clock starts at 0 with the
    process), over the measured pods bound; NaN when none was."""
    return ratio(cpu_s_at_last_binding, bound) * 1000


def rotation(sides: tuple[str, ...], run: int) -> tuple[str, ...]:
    """The order of the rows in repeat ``run`` (1-based): the first side of the previous
    repeat goes last, so over len(sides) repeats each runs once in every position."""
    k = (run - 1) % len(sides)
    return sides[k:] + sides[:k]


@dataclass(frozen=True)
class Spread:
    """min, median and max of one figure over repeats (NaN runs left out)."""

    low: float
    median: float
    high: float
    n: int
    """How many repeats gave a figure."""


def min_median_max(values: list[float]) -> Spread:
    ok = [v for v in values if not math.isnan(v)]
    if not ok:
        return Spread(math.nan, math.nan, math.nan, 0)
    return Spread(min(ok), statistics.median(ok), max(ok), len(ok))


@dataclass(frozen=True)
class Ratios:
    """Lattice / kube-scheduler for one workload and run: > 1 means Lattice is
    faster (pods/s) or costs more (CPU per pod, RSS, p99)."""

    workload: str
    run: int
    pods_per_s: float
    cpu_per_pod: float
    rss: float
    p99: float
    kube_of_floor: float = math.nan
    """kube-scheduler's pods/s / the null binder's, same repeat (NaN without a floor row)."""
    lattice_of_floor: float = math.nan
    cpu_whole_per_pod: float = math.nan
    """Lattice / kube-scheduler whole-process CPU per pod."""


def ratios(results: list[Result]) -> list[Ratios]:
    """One row per (workload, run) that has both schedulers, in the order run."""
    by = {(r.workload, r.run, r.scheduler): r for r in results}
    out = []
    for w, run in dict.fromkeys((r.workload, r.run) for r in results):
        k, lat = by.get((w, run, KUBE)), by.get((w, run, LATTICE))
        if k is None or lat is None:
            continue
        floor = by.get((w, run, NULL))
        floor_rate = floor.pods_per_s if floor is not None else math.nan
        out.append(
            Ratios(
                w,
                run,
                ratio(lat.pods_per_s, k.pods_per_s),
                ratio(lat.cpu_ms_per_pod, k.cpu_ms_per_pod),
                ratio(lat.rss_mib, k.rss_mib),
                ratio(lat.p99_ms, k.p99_ms),
                ratio(k.pods_per_s, floor_rate),
                ratio(lat.pods_per_s, floor_rate),
                ratio(lat.cpu_whole_ms_per_pod, k.cpu_whole_ms_per_pod),
            )
        )
    return out


def _f(value: float, fmt: str, unit: str = "") -> str:
    return "n/a" if math.isnan(value) else format(value, fmt) + unit


@dataclass(frozen=True)
class Summary:
    """One scheduler's figures for one workload over its repeats."""

    workload: str
    scheduler: str
    runs: int
    pods_per_s: Spread
    vs_kube: Spread
    """This row's pods/s / kube-scheduler's, per repeat."""
    of_floor: Spread
    """This row's pods/s / the null binder's, per repeat."""
    cpu_window: Spread
    cpu_whole: Spread


def _versus(by: dict[tuple[str, int, str], Result], rows: list[Result], other: str) -> Spread:
    """Each row's pods/s over ``other``'s in the same workload and repeat."""
    pairs = [(r, by.get((r.workload, r.run, other))) for r in rows]
    return min_median_max([ratio(r.pods_per_s, o.pods_per_s) for r, o in pairs if o])


def summaries(results: list[Result]) -> list[Summary]:
    """Per workload (in the order run) and scheduler (kube-scheduler, Lattice, the floor):
    min / median / max over repeats; the ratios pair rows of the same repeat."""
    by = {(r.workload, r.run, r.scheduler): r for r in results}
    out = []
    for w in dict.fromkeys(r.workload for r in results):
        for which in (KUBE, LATTICE, NULL):
            mine = [r for r in results if r.workload == w and r.scheduler == which]
            if not mine:
                continue

            out.append(
                Summary(
                    w,
                    which,
                    len(mine),
                    min_median_max([r.pods_per_s for r in mine]),
                    _versus(by, mine, KUBE),
                    _versus(by, mine, NULL),
                    min_median_max([r.cpu_ms_per_pod for r in mine]),
                    min_median_max([r.cpu_whole_ms_per_pod for r in mine]),
                )
            )
    return out


def _s(value: Spread, fmt: str, unit: str = "") -> str:
    if not value.n:
        return "n/a"
    return " / ".join(_f(v, fmt, unit) for v in (value.low, value.median, value.high))


def summary_table(results: list[Result]) -> list[str]:
    """The summary as markdown lines (none when nothing was measured)."""
    sums = summaries(results)
    if not sums:
        return []
    rows: list[tuple[str, ...]] = [
        (
            "workload",
            "scheduler",
            "runs",
            "pods/s min / median / max",
            "x kube-scheduler",
            "of floor",
            "CPU ms/pod window",
            "CPU ms/pod whole",
        )
    ]
    for q in sums:
        rows.append(
            (
                q.workload,
                q.scheduler,
                str(q.runs),
                _s(q.pods_per_s, ".1f"),
                _s(q.vs_kube, ".2f", "x"),
                _s(q.of_floor, ".2f"),
                _s(q.cpu_window, ".2f"),
                _s(q.cpu_whole, ".2f"),
            )
        )
    return ["", "summary over repeats (min / median / max):", *_markdown(rows)]


def _markdown(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    ]
    lines.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return lines


def watch_note(r: Result) -> str:
    """What the benchmark's own watch had to do for this figure."""
    if r.relists:
        return f"{r.relists} re-list(s), {r.relisted} pods timed late"
    return f"{r.resumes} resumes" if r.resumes else "-"


def table(results: list[Result]) -> str:
    """Per-run figures, then the ratios, then (with repeats) each ratio's range."""
    rows: list[tuple[str, ...]] = [
        (
            "workload",
            "run",
            "scheduler",
            "existing",
            "bound",
            "pods/s",
            "of floor",
            "CPU ms/pod window",
            "CPU ms/pod whole",
            "plane ms/pod",
            "CPU s",
            "peak RSS MiB",
            "stream p50/p99 ms",
            "watch",
        )
    ]
    floors = {(r.workload, r.run): r.pods_per_s for r in results if r.scheduler == NULL}
    for r in results:
        rows.append(
            (
                r.workload,
                str(r.run),
                r.scheduler,
                str(r.existing),
                f"{r.bound}/{r.pods}",
                _f(r.pods_per_s, ".1f"),
                _f(ratio(r.pods_per_s, floors.get((r.workload, r.run), math.nan)), ".2f"),
                _f(r.cpu_ms_per_pod, ".2f"),
                _f(r.cpu_whole_ms_per_pod, ".2f"),
                _f(r.plane_ms_per_pod, ".2f"),
                _f(r.cpu_s, ".1f"),
                _f(r.rss_mib, ".0f"),
                f"{_f(r.p50_ms, '.0f')}/{_f(r.p99_ms, '.0f')} ({r.stream_bound}/{r.stream})",
                watch_note(r),
            )
        )
    out = _markdown(rows)
    rats = ratios(results)
    if rats:
        rrows: list[tuple[str, ...]] = [
            (
                "workload",
                "run",
                "pods/s L/K",
                "K of floor",
                "L of floor",
                "CPU/pod L/K",
                "whole CPU/pod L/K",
                "RSS L/K",
                "p99 L/K",
            )
        ]
        for q in rats:
            rrows.append(
                (
                    q.workload,
                    str(q.run),
                    _f(q.pods_per_s, ".2f", "x"),
                    _f(q.kube_of_floor, ".2f"),
                    _f(q.lattice_of_floor, ".2f"),
                    _f(q.cpu_per_pod, ".2f", "x"),
                    _f(q.cpu_whole_per_pod, ".2f", "x"),
                    _f(q.rss, ".2f", "x"),
                    _f(q.p99, ".2f", "x"),
                )
            )
        out += ["", *_markdown(rrows)]
    out += spans(rats)
    out += summary_table(results)
    warnings = [
        f"WARNING: {r.workload} run {r.run} {r.scheduler}: "
        + "; ".join(
            ([f"bound {r.bound}/{r.pods}"] if r.bound < r.pods else [])
            + ([f"stream bound {r.stream_bound}/{r.stream}"] if r.stream_bound < r.stream else [])
            + (
                [f"watch re-listed {r.relists}x: {r.relisted} pods' times are the re-list's"]
                if r.relists
                else []
            )
        )
        for r in results
        if not r.complete or r.relists
    ]
    notes = list(dict.fromkeys(f"note: {r.workload}: {n}" for r in results for n in r.notes))
    return "\n".join([*out, *([""] if warnings or notes else []), *warnings, *notes])


def spans(rats: list[Ratios]) -> list[str]:
    """With more than one run of a workload: min, median and max of its pods/s and
    CPU-per-pod ratios (a single run's ratio is not a result here)."""
    lines = []
    for w in dict.fromkeys(q.workload for q in rats):
        mine = [q for q in rats if q.workload == w]
        if len(mine) < 2:
            continue
        parts = []
        for label, vals in (
            ("pods/s", [q.pods_per_s for q in mine]),
            ("CPU/pod", [q.cpu_per_pod for q in mine]),
        ):
            ok = [v for v in vals if not math.isnan(v)]
            if ok:
                parts.append(
                    f"{label} {min(ok):.2f}x / {statistics.median(ok):.2f}x / {max(ok):.2f}x"
                )
        lines.append(f"{w} over {len(mine)} runs, min / median / max L/K: " + ", ".join(parts))
    return ([""] if lines else []) + lines


def progress_line(r: Result, summary: str) -> str:
    """One run's figures as soon as it ends (the table comes at the very end)."""
    return (
        f"{r.workload:>18} run {r.run} {r.scheduler:>14}: {_f(r.pods_per_s, '.1f')} pods/s, "
        f"{_f(r.cpu_ms_per_pod, '.2f')} ms CPU/pod window, "
        f"{_f(r.cpu_whole_ms_per_pod, '.2f')} whole (API server + etcd "
        f"{_f(r.plane_ms_per_pod, '.2f')}), {summary}, CPU {r.cpu_s:.1f}s, "
        f"peak RSS {_f(r.rss_mib, '.0f')} MiB, stream p50/p99 "
        f"{_f(r.p50_ms, '.0f')}/{_f(r.p99_ms, '.0f')} ms"
    )


# -- measuring ---------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, from /proc/<pid>/stat (fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return math.nan


class Bench:
    def __init__(
        self, cluster: DevCluster, api: client.ApiClient, args: argparse.Namespace
    ) -> None:
        self.cluster = cluster
        self.api = api
        self.core = client.CoreV1Api(api)
        self.args = args
        self.burst: int = args.burst if args.burst is not None else int(2 * args.qps)
        self.null_binder: Path | None = None
        """The floor's binary, set by the caller once built (the floor row needs it)."""

    async def configure_lattice(self) -> None:
        """Lattice's client QPS/burst, in the LatticeScheduler object it reads at start."""
        objects = client.CustomObjectsApi(self.api)
        spec: dict[str, Any] = {
            "schedulerName": LATTICE,
            "clientQPS": self.args.qps,
            "clientBurst": self.burst,
        }
        concurrency = getattr(self.args, "bind_concurrency", None)  # `just profile` has none
        if concurrency is not None:
            spec["bindConcurrency"] = concurrency
        try:
            await objects.get_cluster_custom_object(LS_GROUP, LS_VERSION, LS_PLURAL, LATTICE)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": f"{LS_GROUP}/{LS_VERSION}",
                "kind": "LatticeScheduler",
                "metadata": {"name": LATTICE},
                "spec": spec,
            }
            await objects.create_cluster_custom_object(LS_GROUP, LS_VERSION, LS_PLURAL, body)
            return
        await objects.patch_cluster_custom_object(
            LS_GROUP,
            LS_VERSION,
            LS_PLURAL,
            LATTICE,
            [{"op": "add", "path": f"/spec/{k}", "value": v} for k, v in spec.items()],
        )

    def plane_cpu_seconds(self) -> float:
        """CPU seconds so far of the shared kube-apiserver and etcd (NaN if unreadable)."""
        state = self.cluster.load_state()
        if state is None:
            return math.nan
        try:
            return sum(cpu_seconds(state.pids[n]) for n in ("kube-apiserver", "etcd"))
        except (KeyError, OSError):
            return math.nan

    def start_scheduler(self, which: str) -> int:
        if which == NULL:
            if self.null_binder is None:
                raise RuntimeError("the null binder was not built")
            return self.cluster.start_process(
                NULL,
                [
                    str(self.null_binder),
                    f"--kubeconfig={self.cluster.kubeconfig_for(pki.KUBE_SCHEDULER.name)}",
                    f"--scheduler-name={SCHEDULER_NAMES[NULL]}",
                    f"--qps={self.args.qps:g}",
                    f"--burst={self.burst}",
                    f"--in-flight={self.args.floor_in_flight}",
                ],
                marker="--scheduler-name",
            )
        if which == KUBE:
            return self.cluster.start_kube_scheduler(
                ClusterConfig(
                    kube_scheduler_qps=self.args.qps,
                    kube_scheduler_burst=self.burst,
                    percentage_of_nodes_to_score=100 if self.args.score_all else None,
                )
            )
        return start_lattice(self.cluster)

    async def place_existing(self, ns: str, make: PodMaker, sched_name: str, count: int) -> None:
        """``count`` pods of ``make``'s shape created already bound (``spec.nodeName``, as
        :func:`existing_node_index` spreads them), and run by kwok before anything is timed."""
        existing = []
        for i in range(count):
            body = make(f"e-{i}", sched_name)
            body["spec"]["nodeName"] = node_name(existing_node_index(i, self.args.nodes))
            existing.append(body)
        if existing:
            t0 = time.monotonic()
            await _create(self.core, ns, existing)
            await self._settle(ns, within=max(600.0, len(existing) / 25))  # kwok: ~50 pods/s
            print(f"  {len(existing)} existing pods in {time.monotonic() - t0:.0f}s", flush=True)

    async def _settle(self, ns: str, within: float = 600.0) -> None:
        """Until kwok has every existing pod Running, so its status writes are not
        what the measured scheduler competes with."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            left: Any = await self.core.list_namespaced_pod(
                ns, field_selector="status.phase!=Running", limit=1
            )
            if not left.items:
                return
            await asyncio.sleep(1.0)
        print(f"  (existing pods in {ns} not all Running after {within:.0f}s)", flush=True)

    async def _clear(self, ns: str, within: float = 300.0) -> None:
        """Delete the namespace and its pods (at once: grace 0), and wait until the
        namespace is gone, so the next scheduler starts on the cluster this one found
        and on a quiet API server: the namespace controller deleting the previous run's
        thousands of Events would otherwise compete with the next run (measured: it
        made whichever scheduler ran second look up to 30 % slower). One
        DeleteCollection of thousands of pods can outlast the API server's request
        timeout; the namespace's deletion then finishes the job."""
        with contextlib.suppress(client.ApiException, aiohttp.ClientError, TimeoutError):
            await self.core.delete_collection_namespaced_pod(
                ns, grace_period_seconds=0, _preload_content=False
            )
        with contextlib.suppress(client.ApiException):
            await self.core.delete_namespace(ns, _preload_content=False)
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                await self.core.read_namespace(ns)
            except client.ApiException as exc:
                if exc.status == 404:
                    return
                raise
            await asyncio.sleep(1.0)
        print(f"  ({ns} still not deleted after {within:.0f}s)", flush=True)

    async def run_one(self, workload: str, which: str, run: int) -> Result:
        args = self.args
        core = self.core
        want = args.pods if workload == "plain" else args.affinity_pods
        size = sizes(
            workload, nodes=args.nodes, pods=want, stream=args.stream, existing=args.existing
        )
        ns = f"bench-{workload}-{run}-{NAMESPACE_SUFFIX[which]}"
        await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": ns}}))
        sched_name = SCHEDULER_NAMES[which]
        make = WORKLOADS[workload]

        try:
            await self.place_existing(ns, make, sched_name, size.existing)

            names = [f"p-{i}" for i in range(size.measured)]
            backlog = set(names)
            pid = 0
            marks: dict[str, float] = {}

            def on_bound(name: str, _node: str, _now: float) -> None:
                if name not in backlog or not pid:
                    return
                marks["n"] = marks.get("n", 0) + 1
                if marks["n"] == 1:
                    marks["first"] = cpu_seconds(pid)
                    marks["plane_first"] = self.plane_cpu_seconds()
                if marks["n"] == len(backlog):
                    marks["last"] = cpu_seconds(pid)
                    marks["plane_last"] = self.plane_cpu_seconds()

            watcher = Watcher(self.api, ns, on_bound)
            watcher.start()
            try:
                await watcher.started.wait()
                await _create(core, ns, [make(name, sched_name) for name in names])
                pid = self.start_scheduler(which)
                result = await self._measure(workload, which, run, size, watcher, pid, marks, make)
            finally:
                await watcher.stop()
                self.cluster.stop_component(COMPONENTS[which])
            summary = watcher.summary(backlog)
            print(progress_line(result, summary), flush=True)
            if watcher.relists:
                print(f"  WARNING: {ns}: the benchmark's watch re-listed ({summary})", flush=True)
            return result
        finally:
            with contextlib.suppress(client.ApiException, aiohttp.ClientError, TimeoutError):
                # The namespace controller deletes ~100 pods/s here: 32 000 take minutes.
                total = size.existing + size.measured + size.stream
                await self._clear(ns, within=max(300.0, total / 50))

    async def _measure(
        self,
        workload: str,
        which: str,
        run: int,
        size: Sizes,
        watcher: Watcher,
        pid: int,
        marks: dict[str, float],
        make: PodMaker,
    ) -> Result:
        """Wait for the backlog, then stream; the figures, read while the process lives."""
        args = self.args
        backlog = {f"p-{i}" for i in range(size.measured)}
        unbound = await _wait_all(watcher, backlog, args.timeout)
        marks.setdefault("last", cpu_seconds(pid))
        marks.setdefault("plane_last", self.plane_cpu_seconds())
        times = sorted(watcher.bound[n] for n in backlog if n in watcher.bound)
        span = times[-1] - times[0] if len(times) > 1 else math.nan
        cpu_per_pod = (
            ratio(marks["last"] - marks["first"], len(times) - 1) * 1000
            if "first" in marks
            else math.nan
        )
        plane_per_pod = (
            ratio(marks["plane_last"] - marks["plane_first"], len(times) - 1) * 1000
            if "plane_first" in marks
            else math.nan
        )
        sched_name = SCHEDULER_NAMES[which]
        streamed = [make(f"s-{i}", sched_name) for i in range(size.stream)]
        sent = await _create(self.core, watcher.ns, streamed, rate=args.rate)
        await _wait_all(watcher, set(sent), args.timeout)
        lat = np.array([watcher.bound[k] - t for k, t in sent.items() if k in watcher.bound])
        p50, p99 = (np.percentile(lat, [50, 99]) * 1000).tolist() if len(lat) else (math.nan,) * 2
        return Result(
            workload=workload,
            scheduler=which,
            run=run,
            pods=size.measured,
            bound=size.measured - unbound,
            existing=size.existing,
            pods_per_s=ratio(len(times) - 1, span),
            cpu_ms_per_pod=cpu_per_pod,
            cpu_whole_ms_per_pod=whole_cpu_ms_per_pod(marks["last"], len(times)),
            cpu_s=cpu_seconds(pid),
            rss_mib=peak_rss_mib(pid),
            plane_ms_per_pod=plane_per_pod,
            p50_ms=p50,
            p99_ms=p99,
            stream=len(sent),
            stream_bound=len(set(sent) & watcher.bound.keys()),
            resumes=watcher.reconnects,
            relists=watcher.relists,
            relisted=len(backlog & watcher.relisted),
            notes=list(size.notes),
        )


async def _bench(cluster: DevCluster, args: argparse.Namespace) -> list[Result]:
    results: list[Result] = []
    async with api_client(cluster.kubeconfig) as api:
        bench = Bench(cluster, api, args)
        await bench.configure_lattice()
        sides: tuple[str, ...] = SIDES
        if args.floor:
            bench.null_binder = ensure_null_binder(lambda line: print(f"  {line}", flush=True))
            sides = (*SIDES, NULL)
        for workload in args.workloads:
            for run in range(1, args.repeat + 1):
                for which in rotation(sides, run):
                    try:
                        results.append(await bench.run_one(workload, which, run))
                    except (client.ApiException, aiohttp.ClientError, OSError) as exc:
                        # One broken run must not cost the figures of the others.
                        print(f"{workload} run {run} {which}: FAILED: {exc!r}", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=5000, help="plain-pod backlog")
    parser.add_argument(
        "--affinity-pods",
        type=int,
        default=800,
        help="backlog for the affinity and spread workloads",
    )
    parser.add_argument(
        "--existing",
        type=int,
        default=0,
        help="pods of the same shape already bound (pre-bound via spec.nodeName) before the "
        "backlog; the issue's reference is --nodes 2000 --existing 1000",
    )
    parser.add_argument(
        "--qps", type=float, default=5000.0, help="client QPS of both schedulers (default 5000)"
    )
    parser.add_argument("--burst", type=int, default=None, help="client burst (default 2 x qps)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each workload")
    parser.add_argument(
        "--score-all",
        action="store_true",
        help="kube-scheduler scores every node (percentageOfNodesToScore 100): a tuned peer, "
        "not its default",
    )
    parser.add_argument("--stream", type=int, default=200, help="pods in the latency stream")
    parser.add_argument(
        "--bind-concurrency",
        type=int,
        default=None,
        help="Lattice's bindConcurrency (default: Lattice's own default)",
    )
    parser.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="leave out the null-binder row (the floor each pods/s is a fraction of)",
    )
    parser.add_argument(
        "--floor-in-flight",
        type=int,
        default=64,
        help="the null binder's bindings outstanding at once (default 64, Lattice's "
        "default bindConcurrency; unbounded, a parked backlog overflows the API server's "
        "fairness queue and client-go waits 1 s per 429)",
    )
    parser.add_argument("--rate", type=float, default=40.0, help="latency stream, pods/s")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.repeat < 1 or args.existing < 0 or args.qps <= 0:
        parser.error("--nodes and --repeat must be >= 1, --existing >= 0, --qps > 0")
    if args.floor_in_flight < 1:
        parser.error("--floor-in-flight must be >= 1")
    cluster = DevCluster(Path(tempfile.mkdtemp(prefix="lattice-bench-")) / "state")
    started = time.monotonic()
    try:
        state = cluster.up(
            ClusterConfig(nodes=args.nodes, node_ready_timeout=600),
            progress=lambda line: print(f"  {line}", flush=True),
        )
        print(
            f"control plane with {args.nodes} kwok nodes ready in "
            f"{time.monotonic() - started:.0f}s",
            flush=True,
        )
        apply_crds(cluster, state)
        results = asyncio.run(_bench(cluster, args))
    finally:
        cluster.down()
    print()
    print(
        f"--nodes {args.nodes} --existing {args.existing} --qps {args.qps:g} "
        f"--repeat {args.repeat}; Kubernetes {kubernetes_version()}; "
        "L/K = Lattice / kube-scheduler, of floor = pods/s / the null binder's (same repeat); "
        + (
            "(TUNED peer: every node scored, percentageOfNodesToScore 100)"
            if args.score_all
            else "(kube-scheduler's defaults: adaptive percentageOfNodesToScore)"
        )
    )
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Load-aware placement: Lattice beside kube-scheduler on nodes hot from load neither placed.

One devcluster (default 60 kwok nodes of the ``small`` profile: 4 CPU, 16Gi), simulated
node agents (:mod:`lattice_dev.devcluster.loadsim`) reporting every ``--report-interval``
seconds (default 5: the production 15 s scaled down to keep wall time short) with skew:

* ~20 % of the nodes are *hot* from load no scheduler placed: base CPU 85-95 %;
* the rest are *cool*: base CPU 10-50 %; noise sd 2 % of capacity on every report;
* a *step*: partway through each stream (``--step-at``, default 40 %) a few cool nodes
  (``--step-nodes``, default 5 % of the nodes) jump to ~92 % CPU and stay there until the
  phase ends - the reaction test;
* every bound pod adds its requests times ``--usage-ratio`` (default 1.0), ramping in over
  ``--warmup`` seconds (default 10).

The same pod stream (``--pods`` pods of 200m CPU / 256Mi at ``--rate`` pods/s, same names,
same model seed) is run once per phase, each phase in its own namespace after the previous
phase's pods were force-deleted and the agents had reported without them:

a. kube-scheduler (default profile, every node scored);
b. Lattice with its default ``loadAware`` settings - time constants scaled to the report
   interval in the defaults' ratios (``reportIntervalSeconds`` = interval,
   ``staleAfterSeconds`` = 3x, ``settleDelaySeconds`` = 2x; defaults 15/45/30 s);
c. Lattice at cpuAlpha 0.1, 0.3, 0.5, 0.8 (``--alphas``), otherwise as (b).

Each Lattice phase gets a fresh ``lattice run`` (spec patched before it starts), so its
predictor starts from reports taken after the previous phase's pods were gone instead of
still decaying them at that phase's alpha.

Definitions
-----------
real CPU at placement
    the simulator's last published sample of the node when the benchmark's watch sees the
    binding (at most one report interval old): the freshest truth any scheduler could know.
hot placement
    a pod bound to a node whose real CPU at placement was above 80 %.
avoidable
    a hot placement while some other node was at or below 80 % real CPU and had the pod's
    CPU and memory requests free (allocatable minus the requests of the stream's pods bound
    there): the target is zero of these.
after step
    hot placements onto a stepped node after its step (the part that measures reaction).
max / p95 CPU
    over all nodes, of the real CPU (use, clipped at capacity) in the first report after
    every pod of the stream has warmed up.
lag (α table)
    seconds from a step until the predictor's CPU level first reaches 90 % of the step:
    the published reports of every stepped node (each phase from when the previous phase's
    step ended, up to when its own ended) are replayed through :class:`LoadPredictor` at
    that alpha; the step is from the replayed level at the step to the median reported CPU
    after it (pods warming up before the step make the level lag; an EWMA closes the same
    share of any gap per report, so this keeps the lag comparable). The median over
    the steps, a step the level did not cover while it lasted counting as infinitely late
    (shown as ">held s"); "followed" counts the covered steps and "theory" gives the
    reports an EWMA needs, ceil(ln 0.1 / ln(1-α)), and the lag range that implies.
leader churn (α table)
    fraction of report rounds in which the predicted least-loaded cool node (the one a
    least-loaded scorer would rank first) differs from the previous round's, replaying at
    that alpha the pod-free steady series the simulator publishes for the cool nodes (same
    model and seed, noise only; 200 rounds after 40 warm-up rounds). Every change is caused
    by noise, so this is how often noise alone would move placements; lower alpha is calmer
    but lags more.

Run: ``just bench-load`` (or ``python -m lattice_dev.benchmarks.loadaware --help``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast

import numpy as np
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from lattice_dev.benchmarks.common import (
    Watcher,
    apply_crds,
    create_pods,
    start_lattice,
    wait_all,
    wait_lattice_ready,
)
from lattice_dev.devcluster.cluster import ClusterConfig, DevCluster
from lattice_dev.devcluster.kube import api_client
from lattice_dev.devcluster.loadsim import (
    USAGE_RATIO_ANNOTATION,
    LoadSimSettings,
    SimulatedLoadAgents,
    capacity_of,
    kubernetes_agents,
)
from lattice_dev.predict.synthetic import Hotspot, SyntheticLoad, SyntheticNode
from scheduler.predict import CpuMem, LoadPredictor, LoadReport, PredictConfig

HOT: Final = 0.8
"""Real CPU fraction above which a node is hot."""
STEP_TARGET: Final = 0.92
"""Base CPU a stepped node jumps to."""
POD_CPU_MILLI: Final = 200
POD_MEM_BYTES: Final = 256 * 1024 * 1024
LATTICE: Final = "lattice"
GROUP, VERSION, PLURAL = "lattice.dev", "v1alpha1", "latticeschedulers"
CHURN_WARMUP_ROUNDS: Final = 40
CHURN_ROUNDS: Final = 200
STEP_FOREVER: Final = 1e9


# --- the fleet -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fleet:
    nodes: tuple[SyntheticNode, ...]
    hot: frozenset[str]
    """Nodes hot from foreign load."""
    steps: tuple[str, ...]
    """Cool nodes stepped hot partway through each stream."""

    @property
    def cool(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes if n.name not in self.hot)

    def base(self, name: str) -> float:
        return next(n.base_cpu for n in self.nodes if n.name == name)


def design_fleet(
    names: Sequence[str],
    *,
    seed: int,
    cpu_capacity_milli: int,
    mem_capacity_bytes: int,
    hot_fraction: float = 0.2,
    hot_base: tuple[float, float] = (0.85, 0.95),
    cool_base: tuple[float, float] = (0.1, 0.5),
    noise: float = 0.02,
    step_count: int = 3,
) -> Fleet:
    """Pick the hot and stepped nodes and draw base loads, reproducibly from ``seed``."""
    rng = np.random.default_rng(seed)
    ordered = sorted(names)
    n_hot = min(len(ordered), max(1, round(hot_fraction * len(ordered))))
    hot = frozenset(str(x) for x in rng.choice(ordered, size=n_hot, replace=False))
    nodes = tuple(
        SyntheticNode(
            name=name,
            cpu_capacity_milli=cpu_capacity_milli,
            mem_capacity_bytes=mem_capacity_bytes,
            base_cpu=float(rng.uniform(*(hot_base if name in hot else cool_base))),
            base_memory=float(rng.uniform(0.2, 0.3)),
            noise_cpu=noise,
        )
        for name in ordered
    )
    cool = [n for n in ordered if n not in hot]
    steps = tuple(
        sorted(str(x) for x in rng.choice(cool, size=min(step_count, len(cool)), replace=False))
    )
    return Fleet(nodes=nodes, hot=hot, steps=steps)


def step_hotspots(fleet: Fleet, start: float, target: float = STEP_TARGET) -> list[Hotspot]:
    """One step per stepped node, lifting its base CPU to ``target`` at ``start``."""
    return [
        Hotspot(
            nodes=frozenset({name}),
            start=start,
            duration_s=STEP_FOREVER,
            cpu=max(target - fleet.base(name), 0.0),
        )
        for name in fleet.steps
    ]


# --- pure measures -------------------------------------------------------------------------


def classify(
    node: str,
    cpu_fraction: Mapping[str, float],
    free: Mapping[str, tuple[int, int]],
    request: tuple[int, int],
    threshold: float = HOT,
) -> tuple[bool, bool]:
    """(hot, avoidable) for a pod placed on ``node``; see the module docstring.

    ``free`` is (cpu millicores, memory bytes) free by requests before this pod; a node
    without a known CPU figure is neither hot nor an alternative.
    """
    hot = cpu_fraction.get(node, 0.0) > threshold
    if not hot:
        return False, False
    cpu, mem = request
    alternative = any(
        other != node
        and frac <= threshold
        and free.get(other, (0, 0))[0] >= cpu
        and free.get(other, (0, 0))[1] >= mem
        for other, frac in cpu_fraction.items()
    )
    return True, alternative


def p95(values: Sequence[float]) -> float:
    """The 95th percentile, linearly interpolated (numpy's default); NaN when empty."""
    return (
        float(np.percentile(np.asarray(values, dtype=np.float64), 95)) if values else float("nan")
    )


def _replay_config(alpha: float, interval_s: float) -> PredictConfig:
    return PredictConfig(
        cpu_alpha=alpha, report_interval_s=interval_s, stale_after_s=max(3 * interval_s, 45.0)
    )


def _level(predictor: LoadPredictor, report: LoadReport) -> float:
    explained = predictor.explain(
        report.node,
        requested=CpuMem(0.0, 0.0),
        allocatable=CpuMem(report.cpu_capacity_milli, report.mem_capacity_bytes),
        now=report.sample_time,
    )
    assert explained.predicted is not None
    return explained.predicted.cpu


def step_lag(
    reports: Sequence[LoadReport],
    *,
    step_time: float,
    alpha: float,
    interval_s: float,
    fraction: float = 0.9,
) -> float | None:
    """Seconds after ``step_time`` until the replayed CPU level covers ``fraction`` of the step.

    ``reports`` is one node's published series in time order, starting where the node was
    settled. The step is from the replayed level at the step to the median report after it,
    so the lag does not depend on how the level got there (an EWMA closes the same share of
    any gap per report). None when there is no report on one side of the step, the step is
    not an increase, or the level never gets there.
    """
    before = [r for r in reports if r.sample_time < step_time]
    after = [r for r in reports if r.sample_time >= step_time]
    if not before or not after:
        return None
    post = statistics.median(r.cpu_used_milli for r in after)
    predictor = LoadPredictor(_replay_config(alpha, interval_s))
    for r in before:
        predictor.observe_report(r)
    level = _level(predictor, before[-1])
    if post <= level:
        return None
    target = level + fraction * (post - level)
    for r in after:
        predictor.observe_report(r)
        if _level(predictor, r) >= target:
            return r.sample_time - step_time
    return None


def leader_churn(
    series: Mapping[str, Sequence[LoadReport]],
    *,
    alpha: float,
    interval_s: float,
    warmup_rounds: int = CHURN_WARMUP_ROUNDS,
) -> float:
    """Fraction of rounds whose predicted least-loaded node differs from the previous round's.

    ``series`` holds the nodes' reports round by round (equal lengths, round k of every node
    at the same time); rounds before ``warmup_rounds`` only warm the predictor up.
    """
    nodes = tuple(series)
    rounds = min((len(s) for s in series.values()), default=0)
    if rounds - warmup_rounds < 2:
        raise ValueError("need at least two rounds after warm-up")
    predictor = LoadPredictor(_replay_config(alpha, interval_s))
    zeros = np.zeros(len(nodes))
    leaders: list[int] = []
    for k in range(rounds):
        now = max(series[n][k].sample_time for n in nodes)
        for n in nodes:
            predictor.observe_report(series[n][k])
        if k < warmup_rounds:
            continue
        cap_cpu = np.array([series[n][k].cpu_capacity_milli for n in nodes], dtype=np.float64)
        cap_mem = np.array([series[n][k].mem_capacity_bytes for n in nodes], dtype=np.float64)
        batch = predictor.predict(nodes, zeros, zeros, cap_cpu, cap_mem, now=now)
        leaders.append(int(np.argmin(batch.cpu_utilisation)))
    changes = sum(1 for a, b in itertools.pairwise(leaders) if a != b)
    return changes / (len(leaders) - 1)


def steady_series(
    load: SyntheticLoad, nodes: Sequence[str], *, start: float, rounds: int, interval_s: float
) -> dict[str, list[LoadReport]]:
    """What the simulator publishes for pod-free ``nodes`` over ``rounds`` rounds."""
    times = [start + k * interval_s for k in range(rounds)]
    return {n: [load.sample(n, t) for t in times] for n in nodes}


# --- phases --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placement:
    pod: str
    node: str
    at: float
    """Unix time the watch saw the binding."""
    cpu: float
    """Real CPU fraction of the node then."""
    hot: bool
    avoidable: bool
    after_step: bool
    """On a stepped node, after its step."""


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    scheduler: str
    alpha: float | None = None
    """cpuAlpha for a Lattice phase; None = the default."""


@dataclass
class PhaseResult:
    phase: Phase
    placements: list[Placement]
    unbound: int
    cpu_after: dict[str, float]
    stream_start: float
    step_time: float
    end_time: float
    step_series: dict[str, tuple[LoadReport, ...]] = field(default_factory=dict)

    @property
    def hot(self) -> int:
        return sum(p.hot for p in self.placements)

    @property
    def avoidable(self) -> int:
        return sum(p.avoidable for p in self.placements)

    @property
    def after_step(self) -> int:
        return sum(p.hot and p.after_step for p in self.placements)

    @property
    def max_cpu(self) -> float:
        return max(self.cpu_after.values(), default=float("nan"))

    @property
    def p95_cpu(self) -> float:
        return p95(list(self.cpu_after.values()))

    @property
    def hot_nodes_after(self) -> int:
        return sum(v > HOT for v in self.cpu_after.values())


def load_aware_spec(interval_s: float, alpha: float | None) -> dict[str, Any]:
    """spec.loadAware: the defaults with time constants scaled to the report interval."""
    spec: dict[str, Any] = {
        "reportIntervalSeconds": interval_s,
        "staleAfterSeconds": 3 * interval_s,
        "settleDelaySeconds": 2 * interval_s,
    }
    if alpha is not None:
        spec["cpuAlpha"] = alpha
    return spec


def stream_pod(name: str, scheduler: str, usage_ratio: float) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": {"app": "load"}}
    if usage_ratio != 1.0:
        metadata["annotations"] = {USAGE_RATIO_ANNOTATION: str(usage_ratio)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {
                        "requests": {"cpu": f"{POD_CPU_MILLI}m", "memory": f"{POD_MEM_BYTES}"}
                    },
                }
            ],
        },
    }


class LoadBench:
    def __init__(
        self,
        cluster: DevCluster,
        api: client.ApiClient,
        agents: SimulatedLoadAgents,
        fleet: Fleet,
        allocatable: Mapping[str, tuple[int, int]],
        args: argparse.Namespace,
    ) -> None:
        self.cluster = cluster
        self.api = api
        self.core = client.CoreV1Api(api)
        self.objects = client.CustomObjectsApi(api)
        self.agents = agents
        self.fleet = fleet
        self.allocatable = dict(allocatable)
        self.args = args
        self.base_load = SyntheticLoad(fleet.nodes, seed=args.seed)
        self._settled_since = 0.0
        """When the last phase's step ended: the replay of the next step starts after it."""

    async def run_phase(self, index: int, phase: Phase) -> PhaseResult:
        args = self.args
        ns = f"load-{index}-{'kube' if phase.scheduler != LATTICE else 'lattice'}"
        await self.core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": ns}}))
        await self._start_scheduler(phase)
        request = (POD_CPU_MILLI, POD_MEM_BYTES)
        requested: dict[str, list[int]] = {n: [0, 0] for n in self.allocatable}
        placements: list[Placement] = []
        step_time = float("inf")

        def on_bound(name: str, node: str, _mono: float) -> None:
            now = time.time()
            truths = self.agents.truths()
            fractions = {n: r.cpu_used_milli / r.cpu_capacity_milli for n, r in truths.items()}
            free = {
                n: (cpu - requested[n][0], mem - requested[n][1])
                for n, (cpu, mem) in self.allocatable.items()
            }
            hot, avoidable = classify(node, fractions, free, request)
            placements.append(
                Placement(
                    pod=name,
                    node=node,
                    at=now,
                    cpu=fractions.get(node, float("nan")),
                    hot=hot,
                    avoidable=avoidable,
                    after_step=node in self.fleet.steps and now >= step_time,
                )
            )
            if node in requested:
                requested[node][0] += request[0]
                requested[node][1] += request[1]

        watcher = Watcher(self.api, ns, on_bound)
        watcher.start()
        await watcher.started.wait()
        scheduler = "default-scheduler" if phase.scheduler != LATTICE else LATTICE
        bodies = [stream_pod(f"p-{i:04d}", scheduler, args.usage_ratio) for i in range(args.pods)]
        duration = args.pods / args.rate
        stream_start = time.time()
        step_time = stream_start + args.step_at * duration
        self.agents.replace_load(
            SyntheticLoad(
                self.fleet.nodes, seed=args.seed, hotspots=step_hotspots(self.fleet, step_time)
            )
        )
        await create_pods(self.core, ns, bodies, rate=args.rate)
        names = {b["metadata"]["name"] for b in bodies}
        unbound = await wait_all(watcher, names, args.bind_timeout)
        last_bind = max((p.at for p in placements), default=time.time())
        await asyncio.sleep(max(last_bind + args.warmup - time.time(), 0.0))
        settled = await self.agents.next_round()
        while settled.time < last_bind + args.warmup:
            settled = await self.agents.next_round()
        cpu_after = {
            n: r.cpu_used_milli / r.cpu_capacity_milli for n, r in self.agents.truths().items()
        }
        end_time = time.time()
        await watcher.stop()
        self.cluster.stop_component("kube-scheduler" if phase.scheduler != LATTICE else LATTICE)
        step_end = await self._clear(ns)
        lookback = max(stream_start - 6 * args.report_interval, self._settled_since)
        self._settled_since = step_end
        step_series = {
            n: tuple(r for r in self.agents.history(n) if lookback <= r.sample_time < step_end)
            for n in self.fleet.steps
        }
        return PhaseResult(
            phase=phase,
            placements=placements,
            unbound=unbound,
            cpu_after=cpu_after,
            stream_start=stream_start,
            step_time=step_time,
            end_time=end_time,
            step_series=step_series,
        )

    async def _clear(self, ns: str) -> float:
        """Force-delete the phase's pods, end the step, wait for a report without them.

        Returns when the step ended (Unix time).
        """
        await self.core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pods = await self.core.list_namespaced_pod(ns)
            if not pods.items:
                break
            await asyncio.sleep(0.5)
        with contextlib.suppress(ApiException):
            await self.core.delete_namespace(ns)
        self.agents.replace_load(self.base_load)
        cleared = time.time()
        settled = await self.agents.next_round()
        while settled.time < cleared:
            settled = await self.agents.next_round()
        return cleared

    async def _start_scheduler(self, phase: Phase) -> None:
        if phase.scheduler != LATTICE:
            self.cluster.start_kube_scheduler(
                ClusterConfig(percentage_of_nodes_to_score=100 if self.args.score_all else None)
            )
            return
        await self._apply_lattice_spec(load_aware_spec(self.args.report_interval, phase.alpha))
        started = time.time()
        start_lattice(self.cluster)
        await wait_lattice_ready(self.objects, started)

    async def _apply_lattice_spec(self, load_aware: dict[str, Any]) -> None:
        objects: Any = self.objects
        try:
            await objects.get_cluster_custom_object(GROUP, VERSION, PLURAL, LATTICE)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "LatticeScheduler",
                "metadata": {"name": LATTICE},
                "spec": {"schedulerName": LATTICE, "loadAware": load_aware},
            }
            await objects.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
            return
        await objects.patch_cluster_custom_object(
            GROUP,
            VERSION,
            PLURAL,
            LATTICE,
            [{"op": "add", "path": "/spec/loadAware", "value": load_aware}],
        )


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


def phase_table(results: Sequence[PhaseResult]) -> list[str]:
    rows = [
        (
            "phase",
            "pods",
            "hot",
            "avoidable",
            "after step",
            "max CPU",
            "p95 CPU",
            "nodes>80%",
            "unbound",
        )
    ]
    for r in results:
        rows.append(
            (
                r.phase.name,
                str(len(r.placements)),
                str(r.hot),
                str(r.avoidable),
                str(r.after_step),
                f"{r.max_cpu:.2f}",
                f"{r.p95_cpu:.2f}",
                str(r.hot_nodes_after),
                str(r.unbound),
            )
        )
    return _table(rows)


def reports_to_follow(alpha: float, fraction: float = 0.9) -> int:
    """Reports an EWMA with weight ``alpha`` needs to cover ``fraction`` of a step (theory)."""
    if alpha >= 1.0:
        return 1
    return max(1, math.ceil(math.log(1.0 - fraction) / math.log(1.0 - alpha) - 1e-9))


@dataclass(frozen=True, slots=True)
class AlphaRow:
    alpha: float
    label: str
    lags: tuple[float, ...]
    """Replayed lags of the steps the level followed in time."""
    held: tuple[float, ...]
    """For the steps it did not follow: how long each step was held (a lower bound on lag)."""
    hot: int | None
    avoidable: int | None
    after_step: int | None
    churn: float

    @property
    def lag_median(self) -> float:
        """Median over all steps, an unfollowed step counting as infinitely late."""
        values = [*self.lags, *([math.inf] * len(self.held))]
        return statistics.median(values) if values else math.nan


def alpha_rows(
    results: Sequence[PhaseResult],
    alphas: Sequence[float],
    *,
    default_alpha: float,
    interval_s: float,
    steady: Mapping[str, Sequence[LoadReport]],
) -> list[AlphaRow]:
    """One row per alpha (and the default's): replayed lag and churn, measured placements."""
    by_alpha = {r.phase.alpha: r for r in results if r.phase.scheduler == LATTICE}
    steps = [(series, r.step_time) for r in results for series in r.step_series.values() if series]
    rows = []
    for alpha, label in sorted(
        [(a, f"{a:g}") for a in alphas] + [(default_alpha, f"{default_alpha:g} (default)")]
    ):
        lags: list[float] = []
        held: list[float] = []
        for series, t in steps:
            lag = step_lag(series, step_time=t, alpha=alpha, interval_s=interval_s)
            if lag is not None:
                lags.append(lag)
            elif series[-1].sample_time > t:
                held.append(series[-1].sample_time - t)
        phase = by_alpha.get(None if "default" in label else alpha)
        rows.append(
            AlphaRow(
                alpha=alpha,
                label=label,
                lags=tuple(lags),
                held=tuple(held),
                hot=phase.hot if phase else None,
                avoidable=phase.avoidable if phase else None,
                after_step=phase.after_step if phase else None,
                churn=leader_churn(steady, alpha=alpha, interval_s=interval_s),
            )
        )
    return rows


def alpha_table(rows: Sequence[AlphaRow], interval_s: float) -> list[str]:
    def count(x: int | None) -> str:
        return "-" if x is None else str(x)

    out = [
        (
            "α",
            "lag s",
            "followed",
            "theory",
            "hot",
            "avoidable",
            "after step",
            "leader churn/round",
        )
    ]
    for r in rows:
        median = r.lag_median
        if math.isnan(median):
            lag = "-"
        elif math.isinf(median):
            lag = f">{min(r.held):.0f}"
        else:
            lag = f"{median:.0f}"
        k = reports_to_follow(r.alpha)
        out.append(
            (
                r.label,
                lag,
                f"{len(r.lags)}/{len(r.lags) + len(r.held)}",
                f"{k} reports ({(k - 1) * interval_s:g}-{k * interval_s:g} s)",
                count(r.hot),
                count(r.avoidable),
                count(r.after_step),
                f"{r.churn:.2f}",
            )
        )
    return _table(out)


def ratio_lines(results: Sequence[PhaseResult]) -> list[str]:
    kube = next((r for r in results if r.phase.scheduler != LATTICE), None)
    lines = []
    for r in results:
        if r.phase.scheduler != LATTICE or kube is None:
            continue
        lines.append(
            f"Lattice vs kube-scheduler [{r.phase.name}]: hot placements {r.hot} vs {kube.hot} "
            f"(avoidable {r.avoidable} vs {kube.avoidable}), p95 node CPU {r.p95_cpu:.2f} vs "
            f"{kube.p95_cpu:.2f}, max {r.max_cpu:.2f} vs {kube.max_cpu:.2f}"
        )
    return lines


def dump(results: Sequence[PhaseResult]) -> list[dict[str, Any]]:
    """The raw measurements, JSON-ready, for a closer look."""
    return [
        {
            "phase": r.phase.name,
            "alpha": r.phase.alpha,
            "streamStart": r.stream_start,
            "stepTime": r.step_time,
            "endTime": r.end_time,
            "unbound": r.unbound,
            "cpuAfter": r.cpu_after,
            "placements": [
                {
                    "pod": p.pod,
                    "node": p.node,
                    "at": p.at,
                    "cpu": p.cpu,
                    "hot": p.hot,
                    "avoidable": p.avoidable,
                    "afterStep": p.after_step,
                }
                for p in r.placements
            ],
            "stepSeries": {
                n: [[x.sample_time, x.cpu_used_milli] for x in series]
                for n, series in r.step_series.items()
            },
        }
        for r in results
    ]


# --- main ----------------------------------------------------------------------------------


async def _nodes(api: client.ApiClient) -> dict[str, tuple[tuple[int, int], tuple[int, int]]]:
    """Node -> (capacity, allocatable), each (cpu millicores, memory bytes)."""
    core = client.CoreV1Api(api)
    resp: Any = await core.list_node(_preload_content=False)
    out = {}
    for item in json.loads(await resp.read())["items"]:
        status = item.get("status", {})
        cap = capacity_of(status.get("capacity", {}))
        alloc = capacity_of(status.get("allocatable", {}))
        if cap and alloc:
            out[item["metadata"]["name"]] = (cap, alloc)
    return out


async def _bench(cluster: DevCluster, args: argparse.Namespace) -> list[str]:
    async with api_client(cluster.kubeconfig) as api:
        nodes = await _nodes(api)
        (cpu_cap, mem_cap) = next(iter(nodes.values()))[0]
        step_count = (
            args.step_nodes if args.step_nodes is not None else max(1, round(0.05 * len(nodes)))
        )
        fleet = design_fleet(
            list(nodes),
            seed=args.seed,
            cpu_capacity_milli=cpu_cap,
            mem_capacity_bytes=mem_cap,
            hot_fraction=args.hot_fraction,
            noise=args.noise,
            step_count=step_count,
        )
        agents = kubernetes_agents(
            api,
            SyntheticLoad(fleet.nodes, seed=args.seed),
            settings=LoadSimSettings(
                interval_s=args.report_interval,
                usage_ratio=1.0,
                warmup_s=args.warmup,
            ),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(agents.run(stop))
        try:
            first = await agents.next_round()
            if first.failed:
                raise RuntimeError(f"{first.failed} nodes' load could not be published")
            await agents.next_round()
            header = [
                f"{len(nodes)} kwok nodes ({args.node_profile}: {cpu_cap / 1000:g} CPU, "
                f"{mem_cap / 2**30:g}Gi); {len(fleet.hot)} hot from foreign load (base 85-95 %), "
                f"{len(fleet.cool)} cool (10-50 %), noise {args.noise:.0%}; "
                f"{len(fleet.steps)} cool nodes step to ~{STEP_TARGET:.0%} at "
                f"{args.step_at:.0%} of each stream",
                f"stream: {args.pods} pods x {POD_CPU_MILLI}m/256Mi at {args.rate:g}/s "
                f"(usage {args.usage_ratio:g}x requests, warm-up {args.warmup:g} s), seed "
                f"{args.seed}; agents report every {args.report_interval:g} s",
            ]
            print(*header, sep="\n", flush=True)
            bench = LoadBench(
                cluster, api, agents, fleet, {n: v[1] for n, v in nodes.items()}, args
            )
            phases = []
            if not args.skip_kube:
                phases.append(Phase("kube-scheduler", "kube-scheduler"))
            default_alpha = PredictConfig().cpu_alpha
            phases.append(Phase(f"lattice (default α={default_alpha:g})", LATTICE))
            phases += [Phase(f"lattice α={a:g}", LATTICE, a) for a in args.alphas]
            results = []
            for i, phase in enumerate(phases):
                started = time.monotonic()
                r = await bench.run_phase(i, phase)
                results.append(r)
                print(
                    f"{phase.name:>24}: hot {r.hot} (avoidable {r.avoidable}, after step "
                    f"{r.after_step}), max CPU {r.max_cpu:.2f}, p95 {r.p95_cpu:.2f}, "
                    f"unbound {r.unbound} [{time.monotonic() - started:.0f}s]",
                    flush=True,
                )
        finally:
            stop.set()
            await task
    if args.dump is not None:
        args.dump.write_text(json.dumps(dump(results), indent=1))
    steady = steady_series(
        SyntheticLoad(fleet.nodes, seed=args.seed),
        fleet.cool,
        start=time.time(),
        rounds=CHURN_WARMUP_ROUNDS + CHURN_ROUNDS,
        interval_s=args.report_interval,
    )
    rows = alpha_rows(
        results,
        args.alphas,
        default_alpha=default_alpha,
        interval_s=args.report_interval,
        steady=steady,
    )
    return [
        *header,
        "",
        *phase_table(results),
        "",
        "α sensitivity (Lattice; lag and churn replay the simulator's reports through "
        "LoadPredictor at each α):",
        *alpha_table(rows, args.report_interval),
        "",
        *ratio_lines(results),
        "",
        "hot: placements onto nodes above 80 % real CPU (last report) at bind time; avoidable: "
        "while another node at or below 80 % had the requests free; after step: hot ones onto "
        "stepped nodes after the step; max/p95 CPU: real node CPU once every pod warmed up; "
        "lag: median s until the replayed EWMA covers 90 % of a step (followed: steps it "
        "covered before the step ended; theory: reports needed, ceil(ln 0.1 / ln(1-α))); "
        "leader churn: share of report "
        "rounds in which noise alone changes the predicted least-loaded node "
        "(see the module docstring).",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=60)
    parser.add_argument("--node-profile", default="small", help="devcluster node profile")
    parser.add_argument("--pods", type=int, default=200, help="pods per stream")
    parser.add_argument("--rate", type=float, default=4.0, help="stream rate, pods/s")
    parser.add_argument(
        "--report-interval", type=float, default=5.0, help="simulated agents' report interval, s"
    )
    parser.add_argument("--warmup", type=float, default=10.0, help="pod usage ramp-in, s")
    parser.add_argument("--usage-ratio", type=float, default=1.0, help="pod use / requests")
    parser.add_argument("--hot-fraction", type=float, default=0.2)
    parser.add_argument("--noise", type=float, default=0.02, help="CPU noise sd, of capacity")
    parser.add_argument("--step-nodes", type=int, default=None, help="default: 5 %% of nodes")
    parser.add_argument("--step-at", type=float, default=0.4, help="fraction of the stream")
    parser.add_argument("--alphas", type=float, nargs="*", default=[0.1, 0.3, 0.5, 0.8])
    parser.add_argument("--skip-kube", action="store_true", help="Lattice phases only")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--bind-timeout", type=float, default=120.0)
    parser.add_argument(
        "--dump", type=Path, default=None, help="write placements and step series as JSON here"
    )
    parser.add_argument(
        "--score-all",
        action="store_true",
        help="kube-scheduler scores every node (percentageOfNodesToScore 100), a tuned peer; "
        "default: its adaptive default, as its users run it",
    )
    args = parser.parse_args(argv)
    if args.pods < 1 or args.rate <= 0 or args.report_interval <= 0 or args.nodes < 2:
        parser.error("need --pods >= 1, --rate > 0, --report-interval > 0, --nodes >= 2")
    scratch = Path(tempfile.mkdtemp(prefix="lattice-bench-load-"))
    cluster = DevCluster(scratch / "state")
    started = time.monotonic()
    try:
        state = cluster.up(
            ClusterConfig(nodes=args.nodes, node_profile=args.node_profile, node_ready_timeout=600)
        )
        apply_crds(cluster, state)
        print(
            f"control plane with {args.nodes} kwok nodes ready in "
            f"{time.monotonic() - started:.0f}s",
            flush=True,
        )
        lines = asyncio.run(_bench(cluster, args))
    finally:
        cluster.down()
        shutil.rmtree(scratch, ignore_errors=True)
    print()
    print("\n".join(lines))
    print(f"\n(total {time.monotonic() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

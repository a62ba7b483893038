"""Replay a trace through the production Framework, one fresh cluster per policy.

Theory of operation (FGD's replay, Weng et al., USENIX ATC'23):

* Each policy is a :class:`~scheduler.core.profile.Profile` run by the same
  :class:`~scheduler.core.schedule.Framework` `lattice run` builds, over its own
  :class:`~scheduler.core.snapshot.Snapshot` of the trace's nodes and pre-placed pods and
  its own :class:`~scheduler.core.topology.state.TopologyState`, so the policies never see
  each other's placements.
* Tasks arrive in trace order until the GPUs they ask reach ``until_demand`` % of the
  cluster's GPUs (the *arrived GPU demand*; the task that crosses the mark still arrives).
  The arrivals are the same for every policy.
* Each arrival is first shown to the GPU request mix (``gpu_demand.observe``, as the
  controller does when a pod enters the queue), then scheduled once with a seed derived
  from ``seed`` and its index. A placement is applied as the controller's assume applies
  it: to the snapshot and to the device ledger, with the decision's annotations. A task
  that does not fit fails and is dropped, never retried.
* With ``deletions``, before a task arriving at time *t* every placed task whose deletion
  time is <= *t* leaves (a heap by deletion time); without it nothing leaves.
* With ``wait`` (needs ``deletions``), a task that does not fit waits, as a pending pod
  does, instead of failing: after each deletion the waiting tasks are tried again in
  arrival order (those asking more GPUs, cpu or memory than any node has free are
  skipped without a cycle), and a task placed so has waited from its creation to that
  deletion; after the last arrival the running tasks keep ending until no task waits. The
  figures add each size's waiting times and the time-weighted share of the GPUs allocated
  from the first arrival to the last.
* At every whole percent of arrived GPU demand the cluster's unallocated GPUs are recorded,
  as (total - allocated) / total x 100 (FGD's figure).

Pure apart from the clock (wall time per policy) and an optional progress callback.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import numpy as np

from scheduler.core.profile import (
    DEFAULT_PROFILE,
    GPU_RESOURCES,
    Profile,
    ScoringStrategy,
    kube_profile,
)
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.core.topology.state import TopologyState
from scheduler.model.names import CPU, MEMORY
from scheduler.model.pod import Pod
from scheduler.sim import KUBE_DEFAULT, KUBE_MOST_ALLOCATED, LATTICE, POLICY_NAMES
from scheduler.sim.trace import GPU_RESOURCE, Task, Trace

MOST_ALLOCATED_RESOURCES: Final = ((CPU, 1), (MEMORY, 1), (GPU_RESOURCE, 3))
"""kube-scheduler's bin-packing configuration for GPUs as its docs show it: MostAllocated
over cpu, memory and GPUs, GPUs weighted 3."""
_SEED_STRIDE: Final = 1 << 32


class ReplayError(ValueError):
    """The trace cannot be replayed as asked (deletions without creation times)."""


def policy_profile(name: str) -> Profile:
    """The profile of a policy of :data:`~scheduler.sim.POLICY_NAMES`."""
    if name == LATTICE:
        return DEFAULT_PROFILE
    if name == KUBE_DEFAULT:
        return kube_profile(name=KUBE_DEFAULT)
    if name == KUBE_MOST_ALLOCATED:
        return kube_profile(
            name=KUBE_MOST_ALLOCATED,
            strategy=ScoringStrategy.MOST_ALLOCATED,
            resources=MOST_ALLOCATED_RESOURCES,
        )
    raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    until_demand: float = 100.0
    """Stop arrivals once the GPUs asked reach this share (%) of the cluster's GPUs."""
    deletions: bool = False
    """Free each placed task at its deletion time (tasks need creation times)."""
    seed: int = 0
    """Tie-breaking among equally scored nodes; task ``i`` uses ``seed * 2**32 + i``."""
    wait: bool = False
    """A task that does not fit waits and is retried after deletions (needs deletions)."""

    def __post_init__(self) -> None:
        if not self.until_demand > 0:
            raise ValueError(f"until_demand must be > 0, got {self.until_demand}")
        if self.wait and not self.deletions:
            raise ValueError("wait needs deletions (nothing else frees room for a waiting task)")


@dataclass(slots=True)
class Counts:
    arrived: int = 0
    placed: int = 0

    def add(self, placed: bool) -> None:
        self.arrived += 1
        self.placed += placed


@dataclass(slots=True)
class PolicyResult:
    """What one policy made of the arrivals."""

    policy: str
    gpu_tasks: Counts = field(default_factory=Counts)
    """Tasks asking at least one GPU."""
    multi_gpu_tasks: Counts = field(default_factory=Counts)
    """Tasks asking more than one GPU (also counted in ``gpu_tasks``)."""
    cpu_tasks: Counts = field(default_factory=Counts)
    """Tasks asking no GPU."""
    deleted: int = 0
    """Placed tasks that left again (replays with deletions)."""
    curve: list[tuple[float, float]] = field(default_factory=list)
    """(arrived GPU demand %, unallocated GPU %), at 0 and every whole percent reached."""
    unallocated_gpu_pct: float | None = None
    """Unallocated GPUs at the end, % of the cluster's (None: the cluster has no GPUs)."""
    seconds: float = 0.0
    """Wall time of the replay (scheduling and bookkeeping)."""
    waits: dict[int, list[float]] = field(default_factory=dict)
    """With ``wait``: GPUs asked -> trace seconds each placed task of that size waited
    (0 for a task placed on arrival)."""
    still_waiting: dict[int, int] = field(default_factory=dict)
    """With ``wait``: GPUs asked -> tasks still waiting when the trace ends."""
    allocated_gpu_pct_time: float | None = None
    """With ``deletions``: GPUs allocated, % of the cluster's, averaged over trace time."""

    def multi_gpu_waits(self) -> list[float]:
        """Waiting times of the placed multi-GPU tasks (``wait`` replays)."""
        return [w for gpus, ws in self.waits.items() if gpus > 1 for w in ws]

    @property
    def tasks(self) -> int:
        return self.gpu_tasks.arrived + self.cpu_tasks.arrived

    @property
    def ms_per_task(self) -> float:
        return 1000 * self.seconds / self.tasks if self.tasks else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "unallocatedGpuPercent": _rounded(self.unallocated_gpu_pct),
            "gpuTasks": asdict(self.gpu_tasks),
            "multiGpuTasks": asdict(self.multi_gpu_tasks),
            "cpuTasks": asdict(self.cpu_tasks),
            "deleted": self.deleted,
            "seconds": round(self.seconds, 3),
            "msPerTask": round(self.ms_per_task, 3),
            "curve": [[x, round(y, 3)] for x, y in self.curve],
            "waits": {str(k): [round(w, 3) for w in v] for k, v in sorted(self.waits.items())},
            "stillWaiting": {str(k): v for k, v in sorted(self.still_waiting.items())},
            "allocatedGpuPercentOverTime": _rounded(self.allocated_gpu_pct_time),
        }


@dataclass(frozen=True, slots=True)
class Replay:
    """A trace replayed under several policies."""

    trace: str
    nodes: int
    gpus: int
    """Allocatable GPUs of the cluster."""
    tasks: int
    """Tasks of the trace (after the skipped ones)."""
    skipped: int
    arrived: int
    """Tasks that arrived before the demand limit."""
    arrived_gpus: int
    config: ReplayConfig
    results: list[PolicyResult]

    def to_json(self) -> dict[str, Any]:
        return {
            "trace": self.trace,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "tasks": self.tasks,
            "skipped": self.skipped,
            "arrived": self.arrived,
            "arrivedGpus": self.arrived_gpus,
            # None: no limit (--churn), as JSON has no infinity
            "untilDemandPercent": (
                None if math.isinf(self.config.until_demand) else self.config.until_demand
            ),
            "deletions": self.config.deletions,
            "wait": self.config.wait,
            "seed": self.config.seed,
            "policies": [r.to_json() for r in self.results],
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def arrivals(tasks: Sequence[Task], total_gpus: int, until_demand: float) -> list[Task]:
    """The tasks that arrive: in order, while the GPUs asked so far are below
    ``until_demand`` % of ``total_gpus`` (all of them when the cluster has no GPUs)."""
    if total_gpus <= 0:
        return list(tasks)
    limit = total_gpus * until_demand / 100
    asked = 0
    for i, task in enumerate(tasks):
        if asked >= limit:
            return list(tasks[:i])
        asked += task.gpus
    return list(tasks)


def unallocated_gpus(snapshot: Snapshot, resources: Iterable[str] = GPU_RESOURCES) -> int:
    """GPUs no pod holds, over all nodes (a node overcommitted by its pods counts 0)."""
    free = 0
    for resource in resources:
        col = snapshot.resource_column(resource)
        if col is not None:
            left = snapshot.allocatable[col] - snapshot.requested[col]
            free += int(np.maximum(left, 0).sum())
    return free


class _AllocationClock:
    """Allocated GPUs integrated over trace time, from the first event it is moved to."""

    def __init__(self, allocated: int) -> None:
        self.allocated = allocated
        self.start: float | None = None
        self.last = 0.0
        self.area = 0.0

    def move(self, now: float, delta: int) -> None:
        if self.start is None:
            self.start = self.last = now
        now = max(now, self.last)
        self.area += self.allocated * (now - self.last)
        self.last = now
        self.allocated += delta

    def mean(self, end: float) -> float:
        if self.start is None or end <= self.start:
            return float(self.allocated)
        self.move(end, 0)
        return self.area / (end - self.start)


def replay_policy(
    trace: Trace,
    profile: Profile,
    config: ReplayConfig = ReplayConfig(),
    *,
    tasks: Sequence[Task] | None = None,
    on_task: Callable[[], object] | None = None,
) -> PolicyResult:
    """Replay ``tasks`` (default: the arrivals of ``config``) on a fresh copy of the trace's
    cluster under ``profile``; ``on_task`` is called after each task (progress)."""
    total = trace.gpus
    if tasks is None:
        tasks = arrivals(trace.tasks, total, config.until_demand)
    if config.deletions and any(t.created is None for t in tasks):
        raise ReplayError("deletions need the tasks' creation times (creation_time column)")
    framework = Framework(profile)
    snapshot = Snapshot(trace.nodes, trace.placed)
    topology = TopologyState(profile.topology)
    topology.gpu_demand.set_resources(profile.gpu_placement.resources)
    for pod, node in trace.placed:
        topology.pod_placed(pod, node)

    result = PolicyResult(profile.name)
    leaving: list[tuple[float, int, Pod]] = []
    waiting: dict[int, Task] = {}  # arrival index -> task (insertion order = arrival order)
    asked = 0
    mark = 1
    started = time.perf_counter()
    if total > 0:
        result.curve.append((0.0, 100 * unallocated_gpus(snapshot) / total))
    seed_base = config.seed * _SEED_STRIDE
    clock = _AllocationClock(total - unallocated_gpus(snapshot))
    gpu_col = snapshot.resource_column(GPU_RESOURCE)

    def count(task: Task, placed: bool) -> None:
        gpus = task.gpus
        if gpus > 0:
            result.gpu_tasks.add(placed)
            if gpus > 1:
                result.multi_gpu_tasks.add(placed)
        else:
            result.cpu_tasks.add(placed)

    def place(i: int, task: Task, now: float | None, attempt: int = 0) -> bool:
        pod = task.pod
        seed = seed_base + i + attempt * len(tasks)
        decision = framework.schedule(snapshot, pod, seed=seed, topology=topology)
        selected = decision.selected
        if selected is None:
            return False
        # A pod that does not fit stays pending (without ``wait`` nothing retries it, as in
        # FGD's replay), and the mix counts it waiting.
        topology.gpu_demand.set_pending(pod.key, None)
        snapshot.add_pod(pod, selected)
        topology.pod_placed(pod, selected, decision.annotations)
        if now is not None:
            clock.move(now, task.gpus)
        if config.deletions and task.deleted is not None:
            # A task that waited runs as long as it ran in the trace, from its placement.
            end = task.deleted
            if now is not None and task.created is not None:
                end = now + max(task.deleted - task.created, 0.0)
            heapq.heappush(leaving, (end, i, pod))
        return True

    def fits_somewhere(task: Task) -> bool:
        """Cheap necessary condition: some node has the GPUs, cpu and memory free."""
        requests = task.pod.resources.requests
        left = snapshot.allocatable - snapshot.requested
        ok = np.ones(snapshot.num_nodes, dtype=bool)
        for name, amount in (
            (GPU_RESOURCE, task.gpus),
            (CPU, requests.get(CPU, 0)),
            (MEMORY, requests.get(MEMORY, 0)),
        ):
            col = gpu_col if name == GPU_RESOURCE else snapshot.resource_column(name)
            if amount > 0:
                if col is None:
                    return False
                ok &= left[col] >= amount
        return bool(ok.any())

    attempts = 0

    def free_until(now: float) -> None:
        """Deletions up to ``now``, each followed by a retry of the waiting tasks."""
        nonlocal attempts
        while leaving and leaving[0][0] <= now:
            when, _, gone = heapq.heappop(leaving)
            snapshot.remove_pod(gone)
            topology.pod_removed(gone.key)
            clock.move(when, -sum(gone.resources.requests.get(r, 0) for r in GPU_RESOURCES))
            result.deleted += 1
            if config.wait and waiting:
                attempts += 1
                for j, waiter in list(waiting.items()):
                    if fits_somewhere(waiter) and place(j, waiter, when, attempts):
                        del waiting[j]
                        assert waiter.created is not None
                        result.waits.setdefault(waiter.gpus, []).append(when - waiter.created)
                        count(waiter, True)

    for i, task in enumerate(tasks):
        pod = task.pod
        if config.deletions:
            assert task.created is not None  # checked above
            free_until(task.created)
        # As the controller does: a new pending pod is an arrival of the mix.
        topology.gpu_demand.set_pending(pod.key, pod)
        placed = place(i, task, task.created if config.deletions else None)
        if config.wait:
            if placed:
                result.waits.setdefault(task.gpus, []).append(0.0)
                count(task, True)
            else:
                waiting[i] = task
        else:
            count(task, placed)
        asked += task.gpus
        if total > 0 and asked * 100 >= mark * total:
            unallocated = 100 * unallocated_gpus(snapshot) / total
            while asked * 100 >= mark * total:
                result.curve.append((float(mark), unallocated))
                mark += 1
        if on_task is not None:
            on_task()
    if config.deletions and tasks:
        end = tasks[-1].created
        assert end is not None
        mean_allocated = clock.mean(end)
        if config.wait:
            # After the last arrival the running tasks end in turn; each end gives the
            # waiting ones another try, until none waits or nothing is left to end.
            while waiting and leaving:
                free_until(leaving[0][0])
        if total > 0:
            result.allocated_gpu_pct_time = 100 * mean_allocated / total
    for task in waiting.values():
        count(task, False)
        result.still_waiting[task.gpus] = result.still_waiting.get(task.gpus, 0) + 1
    result.seconds = time.perf_counter() - started
    if total > 0:
        result.unallocated_gpu_pct = 100 * unallocated_gpus(snapshot) / total
    return result


def replay(
    trace: Trace,
    policies: Sequence[str] = POLICY_NAMES,
    config: ReplayConfig = ReplayConfig(),
    *,
    progress: bool = False,
) -> Replay:
    """Every policy over the same arrivals; ``progress``: a tqdm bar per policy on stderr."""
    profiles = [policy_profile(name) for name in policies]
    total = trace.gpus
    tasks = arrivals(trace.tasks, total, config.until_demand)
    results: list[PolicyResult] = []
    for profile in profiles:
        if progress:
            from tqdm import tqdm

            with tqdm(total=len(tasks), desc=profile.name, unit="task", leave=True) as bar:
                results.append(
                    replay_policy(trace, profile, config, tasks=tasks, on_task=bar.update)
                )
        else:
            results.append(replay_policy(trace, profile, config, tasks=tasks))
    return Replay(
        trace=trace.name,
        nodes=len(trace.nodes),
        gpus=total,
        tasks=len(trace.tasks),
        skipped=trace.skipped,
        arrived=len(tasks),
        arrived_gpus=sum(t.gpus for t in tasks),
        config=config,
        results=results,
    )


def format_table(run: Replay) -> str:
    """The summary `lattice simulate` prints: one row per policy."""
    header = (
        f"{run.trace or 'trace'}: {run.nodes} nodes, {run.gpus} GPUs; "
        f"{run.arrived} of {run.tasks} tasks arrived ({run.arrived_gpus} GPUs asked, "
        f"until {run.config.until_demand:g}% of the GPUs"
        + (", with deletions" if run.config.deletions else "")
        + (", tasks that do not fit wait" if run.config.wait else "")
        + f"); {run.skipped} GPU-sharing tasks skipped"
    )
    columns: tuple[str, ...] = (
        "policy",
        "unallocated GPU %",
        "GPU tasks",
        "multi-GPU",
        "CPU-only",
        "ms/task",
    )
    if run.config.deletions:
        columns += ("GPUs allocated % (time avg)",)
    if run.config.wait:
        columns += ("multi-GPU wait mean/p95 s", "still waiting")
    rows = [columns]
    for r in run.results:
        pct = "-" if r.unallocated_gpu_pct is None else f"{r.unallocated_gpu_pct:.2f}"
        row: tuple[str, ...] = (
            r.policy,
            pct,
            f"{r.gpu_tasks.placed}/{r.gpu_tasks.arrived}",
            f"{r.multi_gpu_tasks.placed}/{r.multi_gpu_tasks.arrived}",
            f"{r.cpu_tasks.placed}/{r.cpu_tasks.arrived}",
            f"{r.ms_per_task:.2f}",
        )
        if run.config.deletions:
            avg = r.allocated_gpu_pct_time
            row += ("-" if avg is None else f"{avg:.2f}",)
        if run.config.wait:
            waits = r.multi_gpu_waits()
            row += (
                f"{np.mean(waits):.0f}/{np.percentile(waits, 95):.0f}" if waits else "-",
                str(sum(r.still_waiting.values())),
            )
        rows.append(row)
    widths = [max(len(row[c]) for row in rows) for c in range(len(columns))]
    lines = [header]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            v.rjust(w) for v, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)

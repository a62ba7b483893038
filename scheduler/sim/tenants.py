"""Tenants sharing a GPU cluster under quotas, replayed offline: none, capacity, fair.

Theory of operation
-------------------
* **Tenants** (:class:`Tenant`): a quota (``min``, ``max`` GPUs, a weight) and a task
  stream: Poisson arrivals at an offered GPU load (``load`` x the cluster's GPUs) inside an
  active window (fractions of the horizon), task shapes (cpu, memory, GPUs) drawn from the
  trace's GPU tasks, run times from the trace's clipped run times
  (:func:`~scheduler.sim.trace.run_pool`). Seeded; every policy sees the same stream.
* **Placement** goes through the production :class:`~scheduler.core.schedule.Framework`
  (Lattice's default profile), one fresh :class:`~scheduler.core.snapshot.Snapshot` per
  policy; a task that does not fit waits and is retried after every event (arrival, end,
  eviction), as a pending pod is.
* **Policies** (:data:`POLICIES`):

  - ``none``: today's Lattice: no quota, pending pods in arrival order (equal priority).
  - ``capacity``: scheduler-plugins' CapacityScheduling: a pod is admitted only while its
    quota's used + request stays within ``max`` and all quotas' use + request stays within
    the sum of the minimums; arrival order; a pod whose quota stays within its ``min``
    with it may *reclaim*: evict pods of quotas above their ``min`` (borrowers), victims
    chosen as kube does (on one node, the fewest; within it the newest evicted first by
    reprieving the oldest), never taking a borrower below its ``min``.
  - ``fair``: the same admission and reclaim trigger, plus Lattice's weighted fair share
    (:mod:`scheduler.core.fairshare`, over the pool ``min(cluster GPUs, sum of mins)``):
    among pending pods, the tenant furthest below its fair share goes first, and reclaim's
    victims come from the quota furthest above its fair share first.

  An evicted task is re-queued at once and runs its whole run time again when placed.
* **Figures** per tenant, over the horizon (time averages integrate the state between
  events): GPUs used, guaranteed (``min(min, demand)``) and fair share; the deviation
  ``avg |used - fair| / avg fair``; task waits (arrival to placement, p50/p99); *time to
  min*: how long the tenant was owed its minimum (``used < min`` and a pending task that
  fits under it) per episode, p99; evictions suffered; time above ``max``. For the run:
  reclaim evictions against a per-reclaim lower bound (the fewest pods, largest first,
  whose GPUs could have made room: on the best node, and in the pool).

Pure apart from the wall clock.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final, TypeVar

import numpy as np

from scheduler.core.fairshare import FairShare, QuotaState, deficit, excess, fair_shares
from scheduler.core.profile import DEFAULT_PROFILE
from scheduler.core.quota import (
    Quota,
    QuotaSnapshot,
    admit,
    more_than_min_with,
    used_over_min,
)
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.core.topology.state import TopologyState
from scheduler.model.names import CPU, MEMORY
from scheduler.model.pod import Pod
from scheduler.sim.trace import GPU_RESOURCE, Task, Trace, run_pool

NONE: Final = "none"
CAPACITY: Final = "capacity"
FAIR: Final = "fair"
POLICIES: Final = (NONE, CAPACITY, FAIR)

DEFAULT_TENANTS: Final = (
    "a:30%:100%:1:0.45",
    "b:30%:70%:2:0.55",
    "c:25%:-:1:0.25:0.4-0.8",
    "d:15%:30%:1:0.05",
)
"""Four tenants of unequal demand whose minimums add up to the cluster: ``a`` and ``b``
(weight 2) ask more than their minimums and share what is left, ``c`` arrives late and must
reclaim its minimum from them, ``d`` asks less than its minimum and lends the rest."""
_SEED_STRIDE: Final = 1 << 32
_T = TypeVar("_T")


class TenantError(ValueError):
    """A tenant specification that cannot be read."""


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    min: int
    max: int | None
    """GPUs; None: no cap."""
    weight: Fraction
    load: float
    """Offered GPU load while active, as a fraction of the cluster's GPUs."""
    start: float = 0.0
    end: float = 1.0
    """Active window, fractions of the horizon."""


def _gpus(text: str, cluster: int, what: str) -> int:
    try:
        if text.endswith("%"):
            return int(Fraction(text[:-1]) * cluster / 100)
        return int(text)
    except (ValueError, ZeroDivisionError):
        raise TenantError(
            f"{what}: want GPUs or a percentage of the cluster, got {text!r}"
        ) from None


def parse_tenant(text: str, cluster_gpus: int) -> Tenant:
    """``NAME:MIN:MAX:WEIGHT:LOAD[:START-END]``; MIN and MAX in GPUs or ``N%`` of the
    cluster, MAX ``-`` for none, LOAD a fraction of the cluster's GPUs, START-END fractions
    of the horizon (default 0-1)."""
    parts = text.split(":")
    if len(parts) not in (5, 6) or not parts[0]:
        raise TenantError(f"tenant {text!r}: want NAME:MIN:MAX:WEIGHT:LOAD[:START-END]")
    name = parts[0]
    low = _gpus(parts[1], cluster_gpus, f"tenant {name} min")
    high = None if parts[2] == "-" else _gpus(parts[2], cluster_gpus, f"tenant {name} max")
    try:
        weight = Fraction(parts[3])
        load = float(parts[4])
        start, end = (0.0, 1.0)
        if len(parts) == 6:
            a, _, b = parts[5].partition("-")
            start, end = float(a), float(b)
    except ValueError:
        raise TenantError(f"tenant {text!r}: weight, load and window must be numbers") from None
    if low < 0 or (high is not None and high < low):
        raise TenantError(f"tenant {name}: want 0 <= min <= max")
    if weight <= 0 or not load > 0 or not 0 <= start < end <= 1:
        raise TenantError(f"tenant {name}: want weight > 0, load > 0, 0 <= start < end <= 1")
    return Tenant(name, low, high, weight, load, start, end)


def arrivals(
    tenants: Sequence[Tenant],
    cluster_gpus: int,
    horizon: float,
    rng: np.random.Generator,
    draw: Callable[[np.random.Generator], _T],
    *,
    mean_gpus: float,
    mean_run: float,
) -> list[tuple[float, str, _T]]:
    """Every tenant's Poisson arrivals inside its window, merged in time order (ties by
    name): ``(time, tenant, draw(rng))``. The rate offers ``load`` x the cluster's GPUs in
    GPU-seconds per second, for tasks of ``mean_gpus`` running ``mean_run`` on average; the
    simulator draws trace shapes, the live benchmark (``just bench-quota``) pod sizes."""
    drawn: list[tuple[float, str, _T]] = []
    for tenant in tenants:
        rate = tenant.load * cluster_gpus / (mean_gpus * mean_run)
        now, stop = tenant.start * horizon, tenant.end * horizon
        while True:
            now += float(rng.exponential(1 / rate))
            if now >= stop:
                break
            drawn.append((now, tenant.name, draw(rng)))
    drawn.sort(key=lambda d: (d[0], d[1]))
    return drawn


def tenant_shares(
    tenants: Sequence[Tenant], pool: int, used: Mapping[str, int], demand: Mapping[str, int]
) -> dict[str, FairShare]:
    """Each tenant's fair share of ``pool`` GPUs (``scheduler.core.fairshare``), from the
    GPUs it uses and those it uses or waits for."""
    return fair_shares(
        {GPU_RESOURCE: pool},
        {
            t.name: QuotaState(
                min={GPU_RESOURCE: t.min},
                max={} if t.max is None else {GPU_RESOURCE: t.max},
                used={GPU_RESOURCE: used[t.name]},
                demand={GPU_RESOURCE: demand[t.name]},
                weight=t.weight,
            )
            for t in tenants
        },
    )


def owed_min(tenant: Tenant, used: int, waiting: Iterable[int]) -> bool:
    """Whether the tenant is owed its minimum: below it, with a waiting task (its GPUs in
    ``waiting``) that fits under it."""
    return used < tenant.min and any(used + g <= tenant.min for g in waiting)


@dataclass(frozen=True, slots=True)
class Job:
    """One task of a tenant's stream."""

    id: int
    tenant: str
    pod: Pod
    gpus: int
    created: float
    run: float


def tenant_stream(
    trace: Trace,
    tenants: Sequence[Tenant],
    durations: Sequence[float],
    *,
    horizon_runs: float,
    seed: int,
) -> tuple[list[Job], float]:
    """Every tenant's arrivals, merged in time order, and the horizon (trace seconds):
    ``horizon_runs`` mean run times."""
    pool = run_pool(durations)
    shapes = [t for t in trace.tasks if t.gpus > 0 and t.body is not None]
    if not shapes:
        raise ValueError("the trace has no GPU task to draw tenants' tasks from")
    mean_run = float(np.mean(pool))
    mean_gpus = float(np.mean([t.gpus for t in shapes]))
    horizon = horizon_runs * mean_run
    rng = np.random.default_rng(seed)

    def draw(r: np.random.Generator) -> tuple[Task, float]:
        shape = shapes[int(r.integers(len(shapes)))]
        return shape, float(r.choice(pool))

    drawn = arrivals(
        tenants, trace.gpus, horizon, rng, draw, mean_gpus=mean_gpus, mean_run=mean_run
    )
    jobs = []
    for i, (created, name, (shape, run)) in enumerate(drawn):
        assert shape.body is not None
        body: dict[str, Any] = {**shape.body}
        body["metadata"] = {"name": f"{name}-{i}", "namespace": name, "uid": f"{name}-{i}"}
        jobs.append(Job(i, name, Pod.from_api(body), shape.gpus, created, run))
    return jobs, horizon


@dataclass(slots=True)
class TenantFigures:
    name: str
    waits: list[float] = field(default_factory=list)
    owed: list[float] = field(default_factory=list)
    """Durations of the episodes in which the tenant was owed its minimum."""
    still_owed: int = 0
    """Episodes still open at the end of the horizon."""
    evicted: int = 0
    still_waiting: int = 0
    used_area: float = 0.0
    fair_area: float = 0.0
    guaranteed_area: float = 0.0
    deviation_area: float = 0.0
    above_max_s: float = 0.0

    def add(self, used: int, fair: FairShare, cap: int | None, dt: float) -> None:
        """``dt`` seconds at ``used`` GPUs under the fair share ``fair``, into the time
        averages."""
        share = float(fair.share[GPU_RESOURCE])
        self.used_area += used * dt
        self.fair_area += share * dt
        self.guaranteed_area += float(fair.guaranteed[GPU_RESOURCE]) * dt
        self.deviation_area += abs(used - share) * dt
        if cap is not None and used > cap:
            self.above_max_s += dt

    def to_json(self, span: float) -> dict[str, Any]:
        return {
            "tenant": self.name,
            "usedGpus": round(self.used_area / span, 3),
            "fairGpus": round(self.fair_area / span, 3),
            "guaranteedGpus": round(self.guaranteed_area / span, 3),
            "deviationPercent": _round(self.deviation_pct),
            "leftoverOfFairPercent": _round(self.leftover_pct),
            "waitP50": _round(_pct(self.waits, 50)),
            "waitP99": _round(_pct(self.waits, 99)),
            "owedEpisodes": len(self.owed),
            "timeToMinP99": _round(_pct(self.owed, 99)),
            "stillOwed": self.still_owed,
            "evicted": self.evicted,
            "stillWaiting": self.still_waiting,
            "aboveMaxSeconds": round(self.above_max_s, 3),
        }

    @property
    def deviation_pct(self) -> float | None:
        """Time-averaged ``|used - fair|`` as a share of the time-averaged fair share."""
        return 100 * self.deviation_area / self.fair_area if self.fair_area > 0 else None

    @property
    def leftover_pct(self) -> float | None:
        """What it got beyond its guarantee against what its fair share gives it beyond it
        (time averages; 100: exactly its weighted part of the leftover)."""
        fair_extra = self.fair_area - self.guaranteed_area
        if fair_extra <= 1e-9 * max(self.fair_area, 1.0):
            return None
        return 100 * (self.used_area - self.guaranteed_area) / fair_extra


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass(slots=True)
class PolicyRun:
    policy: str
    tenants: dict[str, TenantFigures]
    evictions: int = 0
    eviction_bound: int = 0
    """Sum over reclaims of the fewest evictions that could have made room."""
    reclaims: int = 0
    seconds: float = 0.0
    series: list[tuple[float, dict[str, int], dict[str, float]]] = field(default_factory=list)
    """(time, used per tenant, fair share per tenant) after every event (for plots)."""

    def to_json(self, span: float) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "reclaims": self.reclaims,
            "evictions": self.evictions,
            "evictionLowerBound": self.eviction_bound,
            "seconds": round(self.seconds, 3),
            "tenants": [t.to_json(span) for t in self.tenants.values()],
        }


class _Cluster:
    """The snapshot plus what the quota rules need: running jobs per node, use per tenant."""

    def __init__(self, trace: Trace) -> None:
        self.snapshot = Snapshot(trace.nodes, [])
        self.topology = TopologyState(DEFAULT_PROFILE.topology)
        self.topology.gpu_demand.set_resources(DEFAULT_PROFILE.gpu_placement.resources)
        self.cols = [
            self.snapshot.resource_column(GPU_RESOURCE),
            self.snapshot.resource_column(CPU),
            self.snapshot.resource_column(MEMORY),
        ]
        self.running: dict[int, tuple[Job, int, float]] = {}  # id -> (job, node index, start)
        self.on_node: dict[int, set[int]] = {}
        self.version = 0
        """Bumped by every placement and removal: verdicts of an older version may differ."""

    def free(self) -> Any:
        """Free (gpu, cpu, memory) per node, a 3 x nodes array."""
        left = self.snapshot.allocatable - self.snapshot.requested
        rows = [left[c] if c is not None else np.zeros(left.shape[1], np.int64) for c in self.cols]
        return np.maximum(np.stack(rows), 0)

    @staticmethod
    def need(job: Job) -> Any:
        r = job.pod.resources.requests
        return np.array([job.gpus, r.get(CPU, 0), r.get(MEMORY, 0)], dtype=np.int64)

    def place(self, job: Job, node: str, now: float, annotations: Any) -> None:
        self.snapshot.add_pod(job.pod, node)
        self.topology.pod_placed(job.pod, node, annotations)
        index = self.snapshot.index_of(node)
        assert index is not None
        self.running[job.id] = (job, index, now)
        self.on_node.setdefault(index, set()).add(job.id)
        self.version += 1

    def remove(self, job_id: int) -> Job:
        job, index, _ = self.running.pop(job_id)
        self.on_node[index].discard(job_id)
        self.snapshot.remove_pod(job.pod)
        self.topology.pod_removed(job.pod.key)
        self.version += 1
        return job


def simulate_policy(
    trace: Trace,
    tenants: Sequence[Tenant],
    jobs: Sequence[Job],
    horizon: float,
    policy: str,
    *,
    warmup: float = 0.0,
    seed: int = 0,
    series: bool = False,
) -> PolicyRun:
    """One policy over the stream (see the module docstring)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
    started = time.perf_counter()
    framework = Framework(DEFAULT_PROFILE)
    cluster = _Cluster(trace)
    by_name = {t.name: t for t in tenants}
    names = [t.name for t in tenants]
    sum_min = sum(t.min for t in tenants)
    pool = min(trace.gpus, sum_min)
    quota = policy != NONE
    run = PolicyRun(policy, {n: TenantFigures(n) for n in names})
    used = dict.fromkeys(names, 0)
    pending: dict[int, tuple[Job, float]] = {}  # id -> (job, enqueued at); arrival order
    pending_gpus = dict.fromkeys(names, 0)
    leaving: list[tuple[float, int, int]] = []  # (end, seq, job id)
    seq = 0
    live: dict[int, int] = {}  # job id -> seq of its current run (an evicted run's end is stale)
    attempts = 0
    owed_since: dict[str, float] = {}

    def shares() -> dict[str, FairShare]:
        return tenant_shares(tenants, pool, used, {n: used[n] + pending_gpus[n] for n in names})

    fair = shares()
    capacity = {GPU_RESOURCE: pool}

    def gap(n: str, sign: int) -> Fraction:
        amounts = {GPU_RESOURCE: used[n]}
        return (deficit if sign < 0 else excess)(amounts, fair[n], capacity)

    def quota_of(n: str) -> Quota:
        t = by_name[n]
        cap = {} if t.max is None else {GPU_RESOURCE: t.max}
        return Quota(n, n, {GPU_RESOURCE: t.min}, cap, {GPU_RESOURCE: used[n]})

    def admitted(job: Job) -> bool:
        """CapacityScheduling's PreFilter, the production rules (scheduler.core.quota)."""
        quotas = QuotaSnapshot({n: quota_of(n) for n in names})
        return admit(quotas, job.tenant, {GPU_RESOURCE: job.gpus}).admitted

    def start(job: Job, node: str, now: float, annotations: Any) -> None:
        nonlocal seq
        cluster.place(job, node, now, annotations)
        del pending[job.id]
        used[job.tenant] += job.gpus
        pending_gpus[job.tenant] -= job.gpus
        seq += 1
        live[job.id] = seq
        heapq.heappush(leaving, (now + job.run, seq, job.id))

    def enqueue(job: Job, now: float) -> None:
        pending[job.id] = (job, now)
        pending_gpus[job.tenant] += job.gpus
        cluster.topology.gpu_demand.set_pending(job.pod.key, job.pod)

    def schedule(job: Job) -> tuple[str, Any] | None:
        decision = framework.schedule(
            cluster.snapshot,
            job.pod,
            seed=seed * _SEED_STRIDE + job.id + attempts * len(jobs),
            topology=cluster.topology,
        )
        if decision.selected is None:
            return None
        return decision.selected, decision.annotations

    def victim_rank(job_id: int) -> tuple[Fraction, float]:
        """Higher evicted first: the quota furthest above fair share (fair), then the
        newest (kube's reprieve keeps the oldest)."""
        job, _, since = cluster.running[job_id]
        above = gap(job.tenant, 1) if policy == FAIR else Fraction(0)
        return above, since

    def reclaim(job: Job, now: float) -> bool:
        """Evict borrowers so ``job`` fits on a node and under the pool; True if it did."""
        borrowers = {n for n in names if used_over_min(quota_of(n))}
        eligible = [j for j, (other, _, _) in cluster.running.items() if other.tenant in borrowers]
        if not eligible:
            return False
        free = cluster.free()
        need = cluster.need(job)
        best: tuple[int, int, int, list[int]] | None = None
        for index, ids in cluster.on_node.items():
            candidates = [j for j in ids if j in set(eligible)]
            if not candidates:
                continue
            room = free[:, index] + sum(cluster.need(cluster.running[j][0]) for j in candidates)
            if not (room >= need).all():
                continue
            victims = []
            # Reprieve in order of importance (least likely victim first).
            for j in sorted(candidates, key=victim_rank):
                back = room - cluster.need(cluster.running[j][0])
                if (back >= need).all():
                    room = back
                else:
                    victims.append(j)
            taken: dict[str, int] = {}
            for j in victims:
                other = cluster.running[j][0]
                taken[other.tenant] = taken.get(other.tenant, 0) + other.gpus
            if any(used[n] - g < by_name[n].min for n, g in taken.items()):
                continue
            gpus = sum(taken.values())
            key = (len(victims), gpus, index, victims)
            if best is None or key[:3] < best[:3]:
                best = key
        if best is None:
            return False
        victims = list(best[3])
        taken = {}
        for j in victims:
            other = cluster.running[j][0]
            taken[other.tenant] = taken.get(other.tenant, 0) + other.gpus
        over = sum(used.values()) - sum(taken.values()) + job.gpus - sum_min
        if over > 0:  # the pool: more borrowers' pods, anywhere, in victim order
            for j in sorted(set(eligible) - set(victims), key=victim_rank, reverse=True):
                if over <= 0:
                    break
                other = cluster.running[j][0]
                if (
                    used[other.tenant] - taken.get(other.tenant, 0) - other.gpus
                    < by_name[other.tenant].min
                ):
                    continue
                victims.append(j)
                taken[other.tenant] = taken.get(other.tenant, 0) + other.gpus
                over -= other.gpus
            if over > 0:
                return False
        run.eviction_bound += _fewest(job, eligible, cluster, free, sum(used.values()), sum_min)
        run.reclaims += 1
        for j in victims:
            victim = cluster.remove(j)
            used[victim.tenant] -= victim.gpus
            run.tenants[victim.tenant].evicted += 1
            run.evictions += 1
            enqueue(victim, now)
        return True

    def try_place(job: Job, now: float, max_free: int) -> bool:
        may_reclaim = quota and not more_than_min_with(
            quota_of(job.tenant), {GPU_RESOURCE: job.gpus}
        )
        blocked = (quota and not admitted(job)) or job.gpus > max_free
        if blocked and not (may_reclaim and reclaim(job, now)):
            return False
        chosen = schedule(job)
        if chosen is None and may_reclaim and reclaim(job, now):
            chosen = schedule(job)
        if chosen is None:
            return False
        enqueued = pending[job.id][1]
        start(job, chosen[0], now, chosen[1])
        if enqueued == job.created and job.created >= warmup:
            run.tenants[job.tenant].waits.append(now - job.created)
        return True

    free_at: list[int] = [-1, 0]  # (version, largest free GPUs on a node)
    failed: dict[tuple[str, int, int, int], int] = {}  # request -> version it failed at

    def attempt(job: Job, now: float) -> bool:
        """``try_place``, skipped where the same tenant's same request failed and nothing
        was placed or freed since (the verdict could only repeat)."""
        r = job.pod.resources.requests
        key = (job.tenant, job.gpus, r.get(CPU, 0), r.get(MEMORY, 0))
        if failed.get(key) == cluster.version:
            return False
        if free_at[0] != cluster.version:
            free_at[:] = [cluster.version, int(cluster.free()[0].max())]
        if try_place(job, now, free_at[1]):
            return True
        failed[key] = cluster.version
        return False

    def pass_(now: float) -> None:
        nonlocal attempts
        attempts += 1
        if policy != FAIR:
            for job, _ in list(pending.values()):
                if job.id in pending:
                    attempt(job, now)
            return
        queues = {n: [j for j, _ in pending.values() if j.tenant == n] for n in names}
        active = [n for n in names if queues[n]]
        while active:
            # The tenant furthest below its fair share first (ties: furthest above last).
            active.sort(key=lambda n: (-gap(n, -1), gap(n, 1), n))
            n = active[0]
            placed = False
            for job in queues[n]:
                if job.id in pending and attempt(job, now):
                    queues[n] = [j for j in queues[n] if j.id in pending]
                    placed = True
                    break
            if not placed:
                active.pop(0)
            else:
                # An eviction re-queued victims: they wait for the next pass.
                active = [m for m in active if queues[m]]

    last = warmup

    def advance(now: float) -> None:
        nonlocal last
        end = min(now, horizon)
        dt = end - last
        if dt > 0:
            for n in names:
                run.tenants[n].add(used[n], fair[n], by_name[n].max, dt)
            last = end

    def track_owed(now: float) -> None:
        for n in names:
            t = by_name[n]
            owed = owed_min(t, used[n], (j.gpus for j, _ in pending.values() if j.tenant == n))
            if owed and n not in owed_since and now >= warmup:
                owed_since[n] = now
            elif not owed and n in owed_since:
                run.tenants[n].owed.append(now - owed_since.pop(n))

    arrivals = list(jobs)
    i = 0
    while i < len(arrivals) or leaving:
        if leaving and (i >= len(arrivals) or leaving[0][0] <= arrivals[i].created):
            now = leaving[0][0]
            if now > horizon and i >= len(arrivals):
                break
            advance(now)
            _, ended, job_id = heapq.heappop(leaving)
            if live.get(job_id) == ended and job_id in cluster.running:
                gone = cluster.remove(job_id)
                used[gone.tenant] -= gone.gpus
        else:
            job = arrivals[i]
            i += 1
            now = job.created
            advance(now)
            enqueue(job, now)
        pass_(now)
        fair = shares()
        track_owed(now)
        if series:
            run.series.append(
                (now, dict(used), {n: float(fair[n].share[GPU_RESOURCE]) for n in names})
            )
    advance(horizon)
    for n, since in owed_since.items():
        run.tenants[n].still_owed += 1
        del since
    for job, _ in pending.values():
        run.tenants[job.tenant].still_waiting += 1
    run.seconds = time.perf_counter() - started
    return run


def _fewest(
    job: Job,
    eligible: Sequence[int],
    cluster: _Cluster,
    free: Any,
    total_used: int,
    sum_min: int,
) -> int:
    """A lower bound on the evictions any reclaim needs to admit ``job``: the fewest
    borrowers' pods (largest first) that free its GPUs on some node, and the fewest that
    bring the pool's use down to make room for it."""
    by_node: dict[int, list[int]] = {}
    sizes = []
    for j in eligible:
        other, index, _ = cluster.running[j]
        by_node.setdefault(index, []).append(other.gpus)
        sizes.append(other.gpus)

    def fewest(amounts: list[int], want: int) -> int | None:
        if want <= 0:
            return 0
        for k, a in enumerate(sorted(amounts, reverse=True), start=1):
            want -= a
            if want <= 0:
                return k
        return None

    node_counts = [
        c
        for index in range(cluster.snapshot.num_nodes)
        if (c := fewest(by_node.get(index, []), job.gpus - int(free[0, index]))) is not None
    ]
    pool_count = fewest(sizes, total_used + job.gpus - sum_min) or 0
    return max(min(node_counts, default=0), pool_count)


@dataclass(frozen=True, slots=True)
class TenantRun:
    trace: str
    nodes: int
    gpus: int
    tenants: list[Tenant]
    jobs: int
    horizon: float
    warmup: float
    """Figures are taken from ``warmup`` to ``horizon`` (trace seconds): the cluster starts
    empty and fills up over the longest run times."""
    seed: int
    runs: list[PolicyRun]

    def to_json(self) -> dict[str, Any]:
        return {
            "trace": self.trace,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "tasks": self.jobs,
            "horizonSeconds": round(self.horizon, 3),
            "warmupSeconds": round(self.warmup, 3),
            "seed": self.seed,
            "tenants": [
                {
                    "name": t.name,
                    "min": t.min,
                    "max": t.max,
                    "weight": str(t.weight),
                    "load": t.load,
                    "window": [t.start, t.end],
                }
                for t in self.tenants
            ],
            "policies": [r.to_json(self.horizon - self.warmup) for r in self.runs],
        }


def simulate(
    trace: Trace,
    tenants: Sequence[Tenant],
    durations: Sequence[float],
    *,
    policies: Sequence[str] = POLICIES,
    horizon_runs: float = 10.0,
    warmup_runs: float = 2.0,
    seed: int = 0,
    series: bool = False,
    on_policy: Callable[[str], object] | None = None,
) -> TenantRun:
    """Every policy over the same tenant streams."""
    names = [t.name for t in tenants]
    if len(set(names)) != len(names):
        raise TenantError("tenant names must be distinct")
    if not tenants:
        raise TenantError("no tenant")
    if trace.gpus <= 0:
        raise ValueError("the cluster has no GPUs")
    if not 0 <= warmup_runs < horizon_runs:
        raise ValueError("want 0 <= warmup < horizon")
    jobs, horizon = tenant_stream(trace, tenants, durations, horizon_runs=horizon_runs, seed=seed)
    warmup = horizon * warmup_runs / horizon_runs
    runs = []
    for policy in policies:
        if on_policy is not None:
            on_policy(policy)
        runs.append(
            simulate_policy(
                trace, tenants, jobs, horizon, policy, warmup=warmup, seed=seed, series=series
            )
        )
    return TenantRun(
        trace.name,
        len(trace.nodes),
        trace.gpus,
        list(tenants),
        len(jobs),
        horizon,
        warmup,
        seed,
        runs,
    )


def _cell(value: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if value is None or math.isnan(value) else fmt.format(value)


def format_table(result: TenantRun) -> str:
    """One row per policy and tenant."""
    h = result.horizon - result.warmup
    lines = [
        f"{result.trace}: {result.nodes} nodes, {result.gpus} GPUs; {result.jobs} tasks of "
        f"{len(result.tenants)} tenants over {result.horizon:.0f} s (figures from "
        f"{result.warmup:.0f} s on), seed {result.seed}",
        "tenants: "
        + ", ".join(
            f"{t.name} min {t.min} max {'-' if t.max is None else t.max} weight {t.weight} "
            f"load {t.load:g}" + ("" if (t.start, t.end) == (0, 1) else f" {t.start:g}-{t.end:g}")
            for t in result.tenants
        ),
    ]
    columns = (
        "policy",
        "tenant",
        "GPUs used",
        "guaranteed",
        "fair",
        "|used-fair| %",
        "leftover/fair %",
        "wait p50/p99 s",
        "to-min p99 s",
        "owed (open)",
        "evicted",
        "s above max",
    )
    rows: list[tuple[str, ...]] = [columns]
    for r in result.runs:
        for f in r.tenants.values():
            rows.append(
                (
                    r.policy,
                    f.name,
                    f"{f.used_area / h:.1f}",
                    f"{f.guaranteed_area / h:.1f}",
                    f"{f.fair_area / h:.1f}",
                    _cell(f.deviation_pct, "{:.1f}"),
                    _cell(f.leftover_pct),
                    f"{_cell(_pct(f.waits, 50))}/{_cell(_pct(f.waits, 99))}",
                    _cell(_pct(f.owed, 99)),
                    f"{len(f.owed)} ({f.still_owed})",
                    str(f.evicted),
                    f"{f.above_max_s:.0f}",
                )
            )
    widths = [max(len(row[c]) for row in rows) for c in range(len(columns))]
    for row in rows:
        lines.append(
            "  ".join(
                [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
                + [v.rjust(w) for v, w in zip(row[2:], widths[2:], strict=True)]
            ).rstrip()
        )
    lines.append(
        "reclaim: "
        + "; ".join(
            f"{r.policy} {r.evictions} evictions in {r.reclaims} reclaims "
            f"(lower bound {r.eviction_bound}), {r.seconds:.1f} s"
            for r in result.runs
        )
    )
    return "\n".join(lines)


def format_summary(results: Sequence[TenantRun]) -> str:
    """One row per policy over several seeds: per-tenant deviation from fair share (mean and
    worst), pooled waits and times to min, evictions against their lower bound."""
    columns = (
        "policy",
        "|used-fair| % mean/max",
        "wait p50/p99 s",
        "to-min p99 s",
        "still owed",
        "evictions (bound)",
        "s above max",
    )
    rows: list[tuple[str, ...]] = [columns]
    policies = list(dict.fromkeys(r.policy for run in results for r in run.runs))
    for policy in policies:
        runs = [r for run in results for r in run.runs if r.policy == policy]
        figures = [f for r in runs for f in r.tenants.values()]
        devs = [d for f in figures if (d := f.deviation_pct) is not None]
        waits = [w for f in figures for w in f.waits]
        owed = [o for f in figures for o in f.owed]
        rows.append(
            (
                policy,
                f"{_cell(float(np.mean(devs)) if devs else None, '{:.1f}')}/"
                f"{_cell(max(devs, default=None), '{:.1f}')}",
                f"{_cell(_pct(waits, 50))}/{_cell(_pct(waits, 99))}",
                _cell(_pct(owed, 99)),
                str(sum(f.still_owed for f in figures)),
                f"{sum(r.evictions for r in runs)} ({sum(r.eviction_bound for r in runs)})",
                f"{sum(f.above_max_s for f in figures):.0f}",
            )
        )
    seeds = ", ".join(str(run.seed) for run in results)
    widths = [max(len(row[c]) for row in rows) for c in range(len(columns))]
    lines = [f"over seeds {seeds}:"]
    for row in rows:
        lines.append(
            "  ".join(
                [row[0].ljust(widths[0])]
                + [v.rjust(w) for v, w in zip(row[1:], widths[1:], strict=True)]
            ).rstrip()
        )
    return "\n".join(lines)

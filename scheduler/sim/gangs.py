"""Gang streams replayed offline through the gang solver, CP-SAT against greedy alone.

Theory of operation
-------------------
* **Stream** (:func:`gang_stream`): the trace's tasks in order. Its multi-GPU tasks are
  grouped into gangs of ``min_members``..``max_members`` (seeded): a gang starts at the
  first multi-GPU task not yet taken; in a *mixed* gang (``mixed_share`` of them) the
  members are the next multi-GPU tasks as they come (each keeps its own cpu, memory and
  GPUs), in the others the next ones of the first member's GPU count (fewer than
  ``min_members`` left: that task stays a single pod). The gang takes the
  first member's place in the order; the other tasks (1-GPU and CPU-only) stay single pods
  between the gangs. Every item then gets churn times as :func:`~scheduler.sim.trace.
  with_churn` gives tasks: Poisson arrivals at offered GPU load ``load`` and a run time
  drawn from the trace's (clipped) run times; a gang's members all run that long.
* **Replay** (:func:`replay_arm`): one fresh cluster per arm (same stream, same seeds).
  Single pods go through :class:`~scheduler.core.schedule.Framework` as in
  :func:`~scheduler.sim.replay.replay_policy`. A gang goes through the controller's own
  path: :func:`~scheduler.solver.build_problem` then :func:`~scheduler.solver.solve` with
  ``use_solver`` True (``spec.gang.solver: CPSAT``) or False (``Greedy``), then each member
  is re-checked on its planned node (``restrict_to``, as the commit does) and assumed;
  all members or none.
* **Waiting**: what does not fit waits, as a pending pod or PodGroup does, and is retried
  in arrival order after each deletion (a gang only when a cheap necessary condition on
  free GPUs holds); whatever still waits ``patience`` trace seconds after its arrival is
  given up (the user deletes it, as ``scheduleTimeoutSeconds`` would fail it). The replay
  ends ``patience`` after the last arrival, when every item is placed or given up.
* **Figures**: gangs admitted / arrived and their mean wait; GPUs allocated, averaged over
  trace time from the first arrival to the last; and the fleet's free GPUs sampled at every
  arrival (Poisson arrivals see time averages): the expected free GPUs the request mix
  cannot use (:func:`~scheduler.core.gpus.fragmentation`, GPUPlacement's measure), the
  free GPUs no size of the mix can use (:func:`~scheduler.core.gpus.stranded`), and the
  free GPUs an 8-GPU member cannot use (on nodes with 1-7 GPUs free). Why the arms differ:
  *rescued* counts CP-SAT admissions greedy alone fell short of, *replanned* admissions
  greedy would also have made but on other nodes (greedy re-run on the same problem), and
  the solve statuses say how rejections ended (``infeasible``: proven, no placement exists).

`lattice simulate --gangs` runs :func:`compare` and prints :func:`format_rows`.
Pure apart from the wall clock (solve times).
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from scheduler.core.gpus import Free, fragmentation, stranded
from scheduler.core.profile import DEFAULT_PROFILE, GPU_RESOURCES, Profile
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.core.topology.state import TopologyState
from scheduler.model.gang import GangSpec
from scheduler.model.names import CPU, MEMORY
from scheduler.model.pod import Pod
from scheduler.sim.replay import _AllocationClock, unallocated_gpus
from scheduler.sim.trace import GPU_RESOURCE, NAMESPACE, Task, Trace, run_pool
from scheduler.solver import build_problem, solve

CPSAT: Final = "CPSAT"
GREEDY: Final = "Greedy"
ARMS: Final = (CPSAT, GREEDY)
"""The two settings of ``spec.gang.solver``."""
WHOLE_NODE_GPUS: Final = 8
_SEED_STRIDE: Final = 1 << 32


@dataclass(frozen=True, slots=True)
class Item:
    """One arrival of the stream: a single pod, or a gang (``gang`` set) of its members."""

    members: tuple[Task, ...]
    created: float
    run: float
    """Trace seconds it runs once placed."""
    gang: GangSpec | None = None

    @property
    def gpus(self) -> int:
        return sum(t.gpus for t in self.members)

    @property
    def mixed(self) -> bool:
        """A gang whose members do not all ask the same GPUs."""
        return len({t.gpus for t in self.members}) > 1


def group_gangs(
    tasks: Sequence[Task],
    *,
    seed: int,
    min_members: int = 2,
    max_members: int = 16,
    mixed_share: float = 0.5,
    gangs: int | None = None,
) -> list[tuple[Task, ...]]:
    """The stream's order: each entry a single task or a gang's members (module docstring).
    With ``gangs``, the order stops after that many gangs. Deterministic for a seed."""
    if not 2 <= min_members <= max_members:
        raise ValueError(f"gang sizes must be 2 <= min <= max, got {min_members}..{max_members}")
    rng = np.random.default_rng([seed, 7])
    multi = [i for i, t in enumerate(tasks) if t.gpus > 1]
    taken: set[int] = set()
    starts: dict[int, tuple[Task, ...]] = {}
    cursor = 0
    while cursor < len(multi):
        first = multi[cursor]
        if first in taken:
            cursor += 1
            continue
        size = int(rng.integers(min_members, max_members + 1))
        mixed = bool(rng.random() < mixed_share)
        want = tasks[first].gpus
        chosen = [i for i in multi[cursor:] if i not in taken and (mixed or tasks[i].gpus == want)][
            :size
        ]
        if len(chosen) < min_members:  # too few partners left: it stays a single pod
            cursor += 1
            continue
        taken.update(chosen)
        starts[first] = tuple(tasks[i] for i in chosen)
        cursor += 1
    order: list[tuple[Task, ...]] = []
    made = 0
    for i, task in enumerate(tasks):
        if i in starts:
            order.append(starts[i])
            made += 1
            if gangs is not None and made >= gangs:
                break
        elif i not in taken:
            order.append((task,))
    return order


def gang_stream(
    trace: Trace,
    durations: Sequence[float],
    *,
    load: float,
    seed: int,
    min_members: int = 2,
    max_members: int = 16,
    mixed_share: float = 0.5,
    gangs: int | None = None,
    shuffle: bool = False,
) -> list[Item]:
    """:func:`group_gangs` of the trace's tasks with churn times (module docstring).
    ``shuffle``: the grouped entries arrive in a seeded random order instead of the file's
    (in ``openb_pod_list_multigpu40.csv`` nearly all multi-GPU tasks are its last rows, so
    in file order the gangs come as one burst at the end of the stream)."""
    if not load > 0 or trace.gpus <= 0:
        raise ValueError("a gang stream needs load > 0 and a cluster with GPUs")
    pool = run_pool(durations)
    order = group_gangs(
        trace.tasks,
        seed=seed,
        min_members=min_members,
        max_members=max_members,
        mixed_share=mixed_share,
        gangs=gangs,
    )
    if shuffle:
        permutation = np.random.default_rng([seed, 13]).permutation(len(order))
        order = [order[int(i)] for i in permutation]
    rng = np.random.default_rng([seed, 11])
    runs = rng.choice(pool, size=len(order))
    gpu_seconds = sum(sum(t.gpus for t in g) * r for g, r in zip(order, runs, strict=True))
    span = gpu_seconds / (trace.gpus * load)
    starts = np.cumsum(rng.exponential(span / len(order), size=len(order)))
    items: list[Item] = []
    for n, (group, start, run) in enumerate(zip(order, starts, runs, strict=True)):
        spec = None
        if len(group) > 1:
            spec = GangSpec(namespace=NAMESPACE, name=f"gang-{n:05d}", min_member=len(group))
        items.append(Item(group, float(start), float(run), spec))
    return items


@dataclass(frozen=True, slots=True)
class Event:
    """One change of the replayed cluster (``replay_arm(record=True)``)."""

    at: float
    kind: str
    """``place`` (``pods``: every member and its node, in one event), ``delete`` (the
    item's pods leave) or ``give_up`` (it waited ``patience`` and never started)."""
    item: int
    """Index of the item in the stream."""
    pods: tuple[tuple[str, str], ...] = ()
    """(pod name, node name) for ``place``; (pod name, "") for ``delete``."""


@dataclass(slots=True)
class ArmResult:
    """What one arm (``spec.gang.solver``) made of the stream."""

    arm: str
    gangs: int = 0
    admitted: int = 0
    given_up: int = 0
    mixed: int = 0
    mixed_admitted: int = 0
    rescued: int = 0
    """Gangs admitted on a plan greedy could not find (greedy placed fewer than needed)."""
    gang_gpus: int = 0
    admitted_gpus: int = 0
    waits: list[float] = field(default_factory=list)
    """Trace seconds each admitted gang waited (0: on arrival)."""
    singles: int = 0
    singles_placed: int = 0
    allocated_pct_time: float = 0.0
    unallocated_pct_end: float = 0.0
    """At the last arrival."""
    frag_pct: float = 0.0
    """Expected free GPUs the mix cannot use, % of the cluster's GPUs, mean over arrivals."""
    stranded_pct: float = 0.0
    """Free GPUs no size of the mix can use, % of the cluster's, mean over arrivals."""
    not_whole_pct: float = 0.0
    """Free GPUs on nodes with 1-7 free (an 8-GPU member cannot use them), % of all GPUs."""
    solves: int = 0
    solve_s: float = 0.0
    seconds: float = 0.0
    statuses: Counter[str] = field(default_factory=Counter)
    """How the solves ended (:class:`~scheduler.solver.solve.SolveStatus` values)."""
    short: int = 0
    """Gang attempts not solved: too few free GPUs for the members (:func:`_gang_may_fit`)."""
    recheck_failed: int = 0
    """Admitted plans a member's re-check on its planned node refused (nothing placed)."""
    admitted_names: list[str] = field(default_factory=list)
    """The admitted gangs' names, in admission order."""
    rescued_names: list[str] = field(default_factory=list)
    """The ``rescued`` gangs' names."""
    replanned: int = 0
    """Gangs admitted where greedy also admits but CP-SAT's plan puts the members' GPUs on
    other nodes than greedy alone would, on the same problem (CP-SAT arm only)."""
    events: list[Event] = field(default_factory=list)
    """Every placement, deletion and give-up, when recorded (``record=True``)."""

    @property
    def mean_wait(self) -> float | None:
        return float(np.mean(self.waits)) if self.waits else None

    def to_json(self) -> dict[str, Any]:
        wait = self.mean_wait
        return {
            "arm": self.arm,
            "gangs": {"arrived": self.gangs, "admitted": self.admitted, "givenUp": self.given_up},
            "mixedGangs": {"arrived": self.mixed, "admitted": self.mixed_admitted},
            "rescued": self.rescued,
            "gangGpus": {"arrived": self.gang_gpus, "admitted": self.admitted_gpus},
            "meanGangWaitSeconds": None if wait is None else round(wait, 3),
            "singles": {"arrived": self.singles, "placed": self.singles_placed},
            "allocatedGpuPercentTimeAvg": round(self.allocated_pct_time, 3),
            "unallocatedGpuPercentEnd": round(self.unallocated_pct_end, 3),
            "fragmentationPercentAvg": round(self.frag_pct, 3),
            "strandedPercentAvg": round(self.stranded_pct, 3),
            "freeOnPartialNodesPercentAvg": round(self.not_whole_pct, 3),
            "solves": self.solves,
            "solveSeconds": round(self.solve_s, 3),
            "statuses": dict(sorted(self.statuses.items())),
            "tooFewFreeGpus": self.short,
            "recheckFailed": self.recheck_failed,
            "seconds": round(self.seconds, 3),
            "admittedGangs": list(self.admitted_names),
            "rescuedGangs": list(self.rescued_names),
            "replanned": self.replanned,
        }


def _gang_may_fit(free_gpus: np.ndarray, members: Sequence[Task]) -> bool:
    """Necessary condition: for every size s, the members asking >= s GPUs need as many
    nodes' worth of s-GPU blocks (a member of g >= s GPUs takes at least one block)."""
    for s in sorted({t.gpus for t in members if t.gpus > 0}):
        if int((free_gpus // s).sum()) < sum(1 for t in members if t.gpus >= s):
            return False
    return True


def _gpus_by_node(
    placements: Sequence[tuple[int, str]], pods: Sequence[Pod]
) -> Counter[tuple[str, int]]:
    return Counter(
        (node, sum(pods[i].resources.requests.get(r, 0) for r in GPU_RESOURCES))
        for i, node in placements
    )


def replay_arm(
    trace: Trace,
    items: Sequence[Item],
    *,
    use_solver: bool,
    patience: float,
    seed: int = 0,
    time_limit_s: float = 1.0,
    profile: Profile = DEFAULT_PROFILE,
    on_item: Callable[[], object] | None = None,
    record: bool = False,
) -> ArmResult:
    """Replay ``items`` on a fresh copy of the trace's cluster (module docstring).
    ``record``: keep every :class:`Event` in ``events`` (tests check them independently)."""
    result = ArmResult(CPSAT if use_solver else GREEDY)
    total = trace.gpus
    framework = Framework(profile)
    snapshot = Snapshot(trace.nodes, trace.placed)
    topology = TopologyState(profile.topology)
    topology.gpu_demand.set_resources(profile.gpu_placement.resources)
    for pod, node in trace.placed:
        topology.pod_placed(pod, node)
    clock = _AllocationClock(total - unallocated_gpus(snapshot))
    leaving: list[tuple[float, int, tuple[Pod, ...]]] = []
    waiting: dict[int, Item] = {}
    frag: list[float] = []
    strand: list[float] = []
    not_whole: list[float] = []
    attempts = 0
    started = time.perf_counter()

    def place_single(n: int, item: Item) -> list[tuple[str, str]] | None:
        pod = item.members[0].pod
        seed_n = seed * _SEED_STRIDE + n + attempts * len(items)
        decision = framework.schedule(snapshot, pod, seed=seed_n, topology=topology)
        if decision.selected is None:
            return None
        topology.gpu_demand.set_pending(pod.key, None)
        snapshot.add_pod(pod, decision.selected)
        topology.pod_placed(pod, decision.selected, decision.annotations)
        return [(pod.name, decision.selected)]

    def place_gang(n: int, item: Item) -> list[tuple[str, str]] | None:
        assert item.gang is not None
        free_gpus = Free.of(snapshot, GPU_RESOURCES).gpus
        if not _gang_may_fit(free_gpus, item.members):
            result.short += 1
            return None
        pods = [t.pod for t in item.members]
        seed_n = seed * _SEED_STRIDE + n + attempts * len(items)
        problem = build_problem(
            framework, snapshot, item.gang, pods, need=len(pods), topology=topology, seed=seed_n
        )
        plan = solve(problem, time_limit_s=time_limit_s, seed=seed, use_solver=use_solver)
        result.solves += 1
        result.solve_s += plan.solve_time_s
        result.statuses[str(plan.status)] += 1
        if not plan.admitted:
            return None
        done: list[Pod] = []
        where: list[tuple[str, str]] = []
        for index, node in plan.placements:  # the commit's re-check, member by member
            pod = pods[index]
            decision = framework.schedule(
                snapshot, pod, seed=seed_n, topology=topology, restrict_to=frozenset({node})
            )
            if decision.selected is None:
                for gone in done:
                    snapshot.remove_pod(gone)
                    topology.pod_removed(gone.key)
                result.recheck_failed += 1
                return None
            snapshot.add_pod(pod, decision.selected)
            topology.pod_placed(pod, decision.selected, decision.annotations)
            done.append(pod)
            where.append((pod.name, decision.selected))
        for pod in pods:
            topology.gpu_demand.set_pending(pod.key, None)
        if plan.greedy_placed < plan.need:
            result.rescued += 1
            result.rescued_names.append(item.gang.name)
        elif use_solver:
            alone = solve(problem, time_limit_s=time_limit_s, seed=seed, use_solver=False)
            if _gpus_by_node(alone.placements, pods) != _gpus_by_node(plan.placements, pods):
                result.replanned += 1
        return where

    def place(n: int, item: Item, now: float) -> bool:
        placed = (place_gang if item.gang is not None else place_single)(n, item)
        if placed is None:
            return False
        if record:
            result.events.append(Event(now, "place", n, tuple(placed)))
        clock.move(now, item.gpus)
        heapq.heappush(leaving, (now + item.run, n, tuple(t.pod for t in item.members)))
        if item.gang is not None:
            result.admitted += 1
            result.admitted_names.append(item.gang.name)
            result.admitted_gpus += item.gpus
            result.mixed_admitted += item.mixed
            result.waits.append(now - item.created)
        else:
            result.singles_placed += 1
        return True

    def fits_somewhere(item: Item) -> bool:
        requests = item.members[0].pod.resources.requests
        left = snapshot.allocatable - snapshot.requested
        ok = np.ones(snapshot.num_nodes, dtype=bool)
        for resource, amount in (
            (GPU_RESOURCE, item.gpus),
            (CPU, requests.get(CPU, 0)),
            (MEMORY, requests.get(MEMORY, 0)),
        ):
            col = snapshot.resource_column(resource)
            if amount > 0:
                if col is None:
                    return False
                ok &= left[col] >= amount
        return bool(ok.any())

    def give_up(now: float) -> None:
        for n, item in list(waiting.items()):
            if item.created + patience <= now:
                del waiting[n]
                if record:
                    result.events.append(Event(now, "give_up", n))
                if item.gang is not None:
                    result.given_up += 1
                for t in item.members:
                    topology.gpu_demand.set_pending(t.pod.key, None)

    def advance(now: float) -> None:
        """Deletions up to ``now`` in time order, each followed by a retry of the waiting
        (those whose patience ran out before the deletion are given up first)."""
        nonlocal attempts
        while leaving and leaving[0][0] <= now:
            when, n_left, pods = heapq.heappop(leaving)
            if record:
                result.events.append(
                    Event(when, "delete", n_left, tuple((p.name, "") for p in pods))
                )
            for pod in pods:
                snapshot.remove_pod(pod)
                topology.pod_removed(pod.key)
            clock.move(
                when, -sum(p.resources.requests.get(r, 0) for p in pods for r in GPU_RESOURCES)
            )
            give_up(when)
            if waiting:
                attempts += 1
                for n, waiter in list(waiting.items()):
                    if waiter.gang is None and not fits_somewhere(waiter):
                        continue
                    if place(n, waiter, when):
                        del waiting[n]
        give_up(now)

    def sample() -> None:
        free = Free.of(snapshot, GPU_RESOURCES)
        classes = topology.gpu_demand.classes()
        frag.append(100 * float(fragmentation(free, classes).sum()) / total)
        strand.append(100 * int(stranded(free, classes).sum()) / total)
        partial = (free.gpus > 0) & (free.gpus < WHOLE_NODE_GPUS)
        not_whole.append(100 * int(free.gpus[partial].sum()) / total)

    for n, item in enumerate(items):
        advance(item.created)
        sample()
        if item.gang is not None:
            result.gangs += 1
            result.gang_gpus += item.gpus
            result.mixed += item.mixed
        else:
            result.singles += 1
        for t in item.members:
            topology.gpu_demand.set_pending(t.pod.key, t.pod)
        if not place(n, item, item.created):
            waiting[n] = item
        if on_item is not None:
            on_item()
    if items:
        last = items[-1].created
        result.allocated_pct_time = 100 * clock.mean(last) / total
        result.unallocated_pct_end = 100 * unallocated_gpus(snapshot) / total
        advance(last + patience)
    result.given_up += sum(1 for item in waiting.values() if item.gang is not None)
    result.frag_pct = float(np.mean(frag)) if frag else 0.0
    result.stranded_pct = float(np.mean(strand)) if strand else 0.0
    result.not_whole_pct = float(np.mean(not_whole)) if not_whole else 0.0
    result.seconds = time.perf_counter() - started
    return result


def every_kth_node(trace: Trace, k: int) -> Trace:
    """Every ``k``-th node of the trace (file order), so the node mix stays the trace's:
    the whole task list then offers about ``k`` times the smaller cluster's GPUs, and churn
    reaches a steady state instead of filling the full cluster once."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if k == 1:
        return trace
    if trace.placed:
        raise ValueError("every_kth_node: a trace with placed pods cannot lose nodes")
    keep = list(range(0, len(trace.nodes), k))
    bodies = [trace.node_bodies[i] for i in keep] if trace.node_bodies else []
    return Trace(
        [trace.nodes[i] for i in keep],
        [],
        trace.tasks,
        trace.skipped,
        name=f"{trace.name}-every{k}",
        node_bodies=bodies,
    )


def default_patience(durations: Sequence[float]) -> float:
    """How long a gang waits by default: the median of the (clipped) run times."""
    return float(np.median(run_pool(durations)))


def _replay_with_progress(
    trace: Trace,
    items: Sequence[Item],
    arm: str,
    *,
    progress: bool,
    patience: float,
    seed: int,
    time_limit_s: float,
) -> ArmResult:
    def run(on_item: Callable[[], object] | None) -> ArmResult:
        return replay_arm(
            trace,
            items,
            use_solver=arm == CPSAT,
            patience=patience,
            seed=seed,
            time_limit_s=time_limit_s,
            on_item=on_item,
        )

    if not progress:
        return run(None)
    from tqdm import tqdm

    with tqdm(total=len(items), desc=f"seed {seed} {arm}", unit="item", leave=True) as bar:
        return run(bar.update)


@dataclass(frozen=True, slots=True)
class SeedRun:
    seed: int
    items: int
    gangs: int
    mixed: int
    results: tuple[ArmResult, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "items": self.items,
            "gangs": self.gangs,
            "mixedGangs": self.mixed,
            "arms": [r.to_json() for r in self.results],
        }


def compare(
    trace: Trace,
    durations: Sequence[float],
    *,
    seeds: Sequence[int],
    load: float,
    gangs: int | None,
    patience: float | None = None,
    time_limit_s: float = 1.0,
    mixed_share: float = 0.5,
    min_members: int = 2,
    max_members: int = 16,
    on_run: Callable[[SeedRun], object] | None = None,
    progress: bool = False,
    shuffle: bool = False,
) -> list[SeedRun]:
    """Both arms over the stream of each seed. ``patience`` None: :func:`default_patience`.
    ``progress``: a tqdm bar per seed and arm on stderr."""
    wait = default_patience(durations) if patience is None else patience
    runs: list[SeedRun] = []
    for seed in seeds:
        items = gang_stream(
            trace,
            durations,
            load=load,
            seed=seed,
            gangs=gangs,
            mixed_share=mixed_share,
            min_members=min_members,
            max_members=max_members,
            shuffle=shuffle,
        )
        arms = tuple(
            _replay_with_progress(
                trace,
                items,
                arm,
                progress=progress,
                patience=wait,
                seed=seed,
                time_limit_s=time_limit_s,
            )
            for arm in ARMS
        )
        run = SeedRun(
            seed,
            len(items),
            sum(1 for i in items if i.gang is not None),
            sum(1 for i in items if i.gang is not None and i.mixed),
            arms,
        )
        runs.append(run)
        if on_run is not None:
            on_run(run)
    return runs


COLUMNS: Final = (
    "seed",
    "arm",
    "gangs admitted",
    "mixed admitted",
    "rescued",
    "replanned",
    "gang GPUs admitted",
    "mean gang wait s",
    "singles placed",
    "GPUs alloc % (time avg)",
    "unalloc % (end)",
    "frag % (avg)",
    "stranded % (avg)",
    "free on partial nodes % (avg)",
    "solves",
    "solve s",
)


def format_rows(runs: Sequence[SeedRun]) -> str:
    """One row per seed and arm, aligned."""
    rows: list[tuple[str, ...]] = [COLUMNS]
    for run in runs:
        for r in run.results:
            wait = r.mean_wait
            rows.append(
                (
                    str(run.seed),
                    r.arm,
                    f"{r.admitted}/{r.gangs}",
                    f"{r.mixed_admitted}/{r.mixed}",
                    str(r.rescued),
                    str(r.replanned) if r.arm == CPSAT else "-",
                    f"{r.admitted_gpus}/{r.gang_gpus}",
                    "-" if wait is None else f"{wait:.0f}",
                    f"{r.singles_placed}/{r.singles}",
                    f"{r.allocated_pct_time:.2f}",
                    f"{r.unallocated_pct_end:.2f}",
                    f"{r.frag_pct:.2f}",
                    f"{r.stranded_pct:.2f}",
                    f"{r.not_whole_pct:.2f}",
                    str(r.solves),
                    f"{r.solve_s:.1f}",
                )
            )
    widths = [max(len(row[c]) for row in rows) for c in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )

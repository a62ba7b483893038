"""Gangs in a network topology under churn: Lattice against the rules of kube-scheduler's
and Kueue's topology-aware scheduling, replayed on one generated cluster.

Theory of operation
-------------------
* **Cluster** (:func:`topology_cluster`): blocks x racks x nodes x GPUs per node, every
  node labelled with its block, rack and hostname (:data:`LEVELS`, widest first; rack
  names unique across blocks). CPU and memory are ample, so GPUs decide.
* **Stream** (:func:`topology_stream`): gangs of one shape each (members x GPUs per
  member, 2, 4 or 8), of four kinds (:data:`KINDS`, mix configurable): *required-rack*
  (all members in one rack; a quarter to a whole rack of GPUs), *preferred-rack* and
  *preferred-block* (the fewest racks / blocks; half a rack to four racks of GPUs) and
  *slices* (slices of half or a whole rack's GPUs, each slice in one rack, 2-4 slices,
  preferred block). Poisson arrivals at offered GPU load ``load``; run times exponential
  (mean ``mean_run``) or drawn from a trace's run times. Deterministic for a seed.
* **Policies** (:data:`POLICIES`), each deciding on the same free GPUs:
  - ``Lattice``: the controller's path, :func:`~scheduler.solver.build_problem` with the
    levels and the controller's device and GPU-demand state (every pending member learnt)
    then :func:`~scheduler.solver.solve` (CP-SAT, greedy seeding it);
  - ``Greedy``: the same with ``use_solver=False`` (``spec.gang.solver: Greedy``);
  - ``KubeTAS``: :func:`kube_tas`, kube-scheduler 1.37's topology-aware workload
    scheduling (KEP-5732, alpha), written here from its description;
  - ``KueueBestFit``: :func:`kueue_best_fit`, Kueue's TAS BestFit (KEP-2724), likewise.
  The reference rules never call Lattice's solver.
* **Replay** (:func:`replay_policy`): a fresh cluster per policy, the same stream. A gang
  that does not fit waits and is retried, in arrival order, after every departure; after
  ``patience`` it is given up. A cheap necessary condition (enough members' room in
  total, in one rack for required-rack, in whole slices for slices) skips hopeless
  attempts for every policy alike. A plan is committed member by member after a check of
  each node's free GPUs (``recheck_failed`` counts refusals: a bug, expected 0).
* **Figures**: gangs admitted / arrived; GPUs allocated, averaged over time from the first
  arrival to the last; for gangs with a preferred level, the domains of that level a
  placement spans against the fewest the free capacity allowed at that moment
  (:func:`~scheduler.solver.domains.fewest` over each domain's room for the gang's
  members, in whole slices for sliced gangs); admitted gangs' waits, p50 and p99.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from scheduler.core.profile import DEFAULT_PROFILE
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import IntArray, Snapshot
from scheduler.core.topology.state import TopologyState
from scheduler.model.gang import GangSpec
from scheduler.model.node import Node
from scheduler.model.pod import Pod
from scheduler.sim.replay import _AllocationClock
from scheduler.sim.trace import GPU_RESOURCE, NAMESPACE, node_body, pod_body, run_pool
from scheduler.solver import build_problem, solve
from scheduler.solver.domains import fewest

BLOCK: Final = "example.com/block"
RACK: Final = "example.com/rack"
HOSTNAME: Final = "kubernetes.io/hostname"
LEVELS: Final = (BLOCK, RACK, HOSTNAME)
"""``spec.topology.levels`` of the simulated cluster, widest first."""

REQUIRED_RACK: Final = "required-rack"
PREFERRED_RACK: Final = "preferred-rack"
PREFERRED_BLOCK: Final = "preferred-block"
SLICES: Final = "slices"
KINDS: Final = (REQUIRED_RACK, PREFERRED_RACK, PREFERRED_BLOCK, SLICES)

LATTICE: Final = "Lattice"
GREEDY: Final = "Greedy"
KUBE_TAS: Final = "KubeTAS"
KUEUE: Final = "KueueBestFit"
POLICIES: Final = (LATTICE, GREEDY, KUBE_TAS, KUEUE)

MEMBER_GPUS: Final = (2, 4, 8)
MEMBER_GPU_WEIGHTS: Final = (0.25, 0.35, 0.4)
NODE_CPU_MILLI: Final = 128_000
NODE_MEMORY_MIB: Final = 1 << 20
MEMBER_CPU_MILLI: Final = 1000
MEMBER_MEMORY_MIB: Final = 1024


# --------------------------------------------------------------------------- cluster
@dataclass(frozen=True, slots=True)
class Shape:
    """Blocks x racks per block x nodes per rack x GPUs per node."""

    blocks: int
    racks: int
    nodes: int
    gpus: int

    def __post_init__(self) -> None:
        if min(self.blocks, self.racks, self.nodes, self.gpus) < 1:
            raise ValueError(f"every dimension of the topology must be >= 1, got {self}")

    @classmethod
    def parse(cls, text: str) -> Shape:
        """``BxRxNxG``, e.g. ``4x8x4x8``."""
        parts = text.lower().split("x")
        if len(parts) != 4 or not all(p.isdigit() for p in parts):
            raise ValueError(f"topology must be BLOCKSxRACKSxNODESxGPUS, got {text!r}")
        b, r, n, g = (int(p) for p in parts)
        return cls(b, r, n, g)

    @property
    def rack_gpus(self) -> int:
        return self.nodes * self.gpus

    @property
    def total_gpus(self) -> int:
        return self.blocks * self.racks * self.rack_gpus

    def __str__(self) -> str:
        return f"{self.blocks}x{self.racks}x{self.nodes}x{self.gpus}"


def topology_cluster(shape: Shape) -> list[Node]:
    """The nodes, block by block, rack by rack: ``b{i}-r{j}-n{k}``."""
    nodes: list[Node] = []
    for b in range(shape.blocks):
        for r in range(shape.racks):
            for n in range(shape.nodes):
                name = f"b{b}-r{r}-n{n}"
                body = node_body(
                    name,
                    cpu_milli=NODE_CPU_MILLI,
                    memory_mib=NODE_MEMORY_MIB,
                    gpus=shape.gpus,
                    model="",
                )
                body["metadata"]["labels"].update({BLOCK: f"b{b}", RACK: f"b{b}-r{r}"})
                nodes.append(Node.from_api(body))
    return nodes


@dataclass(frozen=True, slots=True)
class Layout:
    """Each node's domain index per level (``levels[i][node]``), from the node labels."""

    names: tuple[str, ...]
    levels: tuple[IntArray, ...]
    """One array per :data:`LEVELS` entry: domain index of each node."""
    values: tuple[tuple[str, ...], ...]
    """Label value of each domain index, per level."""

    @classmethod
    def of(cls, nodes: Sequence[Node]) -> Layout:
        levels: list[IntArray] = []
        values: list[tuple[str, ...]] = []
        for key in LEVELS:
            labels = [n.labels[key] for n in nodes]
            distinct = tuple(dict.fromkeys(labels))
            index = {v: i for i, v in enumerate(distinct)}
            levels.append(np.array([index[v] for v in labels], dtype=np.int64))
            values.append(distinct)
        return cls(tuple(n.name for n in nodes), tuple(levels), tuple(values))

    def level(self, key: str) -> int:
        return LEVELS.index(key)


# ---------------------------------------------------------------------------- stream
@dataclass(frozen=True, slots=True)
class Gang:
    """One arriving gang: ``members`` pods of ``gpus`` GPUs each."""

    name: str
    kind: str
    members: int
    gpus: int
    created: float
    run: float
    spec: GangSpec
    pods: tuple[Pod, ...]

    @property
    def total_gpus(self) -> int:
        return self.members * self.gpus

    @property
    def preferred(self) -> str | None:
        return self.spec.topology_preferred

    @property
    def unit(self) -> int:
        """Members that go together: the slice size, else 1."""
        return self.spec.slice_size or 1


def _spec(name: str, kind: str, members: int, slice_size: int | None) -> GangSpec:
    if kind == REQUIRED_RACK:
        return GangSpec(namespace=NAMESPACE, name=name, min_member=members, topology_key=RACK)
    if kind == PREFERRED_RACK:
        return GangSpec(namespace=NAMESPACE, name=name, min_member=members, topology_preferred=RACK)
    if kind == PREFERRED_BLOCK:
        return GangSpec(
            namespace=NAMESPACE, name=name, min_member=members, topology_preferred=BLOCK
        )
    if kind == SLICES:
        return GangSpec(
            namespace=NAMESPACE,
            name=name,
            min_member=members,
            topology_preferred=BLOCK,
            slice_size=slice_size,
            slice_key=RACK,
        )
    raise ValueError(f"unknown gang kind {kind!r}")


def make_gang(
    name: str,
    kind: str,
    members: int,
    gpus: int,
    slice_size: int | None = None,
    *,
    created: float = 0.0,
    run: float = 1.0,
) -> Gang:
    """A gang of ``kind`` (:data:`KINDS`): ``members`` pods of ``gpus`` GPUs each."""
    pods = tuple(
        Pod.from_api(
            pod_body(
                f"{name}-{i}",
                uid=f"{name}-{i}",
                cpu_milli=MEMBER_CPU_MILLI,
                memory_mib=MEMBER_MEMORY_MIB,
                gpus=gpus,
            )
        )
        for i in range(members)
    )
    spec = _spec(name, kind, members, slice_size)
    return Gang(name, kind, members, gpus, created, run, spec, pods)


def _draw_shape(rng: np.random.Generator, kind: str, rack_gpus: int) -> tuple[int, int, int | None]:
    """(members, GPUs per member, slice size) of one gang of ``kind``."""
    g = int(rng.choice(MEMBER_GPUS, p=MEMBER_GPU_WEIGHTS))
    g = min(g, rack_gpus)
    if kind == REQUIRED_RACK:  # a quarter .. a whole rack
        total = rack_gpus * int(rng.integers(1, 5)) // 4
    elif kind == SLICES:  # slices of half or a whole rack, 2-4 of them
        slice_gpus = rack_gpus // int(rng.choice((1, 2)))
        size = max(1, slice_gpus // g)
        return size * int(rng.integers(2, 5)), g, size
    else:  # half a rack .. four racks
        total = rack_gpus * int(rng.choice((1, 2, 3, 4, 6, 8))) // 2
    return max(2, total // g), g, None


def topology_stream(
    shape: Shape,
    *,
    gangs: int,
    load: float,
    seed: int,
    mix: Mapping[str, float] | None = None,
    mean_run: float = 3600.0,
    durations: Sequence[float] | None = None,
) -> list[Gang]:
    """``gangs`` gangs of the kinds in ``mix`` (weights; default equal), Poisson arrivals at
    offered GPU load ``load`` (module docstring). Deterministic for a seed."""
    if not load > 0 or gangs < 1:
        raise ValueError("a topology stream needs load > 0 and at least one gang")
    weights = dict.fromkeys(KINDS, 1.0) if mix is None else dict(mix)
    unknown = set(weights) - set(KINDS)
    if unknown or not weights or min(weights.values()) < 0 or sum(weights.values()) <= 0:
        raise ValueError(f"mix: weights >= 0 of {', '.join(KINDS)}, got {dict(weights)}")
    kinds = list(weights)
    p = np.array([weights[k] for k in kinds], dtype=float)
    rng = np.random.default_rng([seed, 37])
    drawn = [kinds[int(i)] for i in rng.choice(len(kinds), size=gangs, p=p / p.sum())]
    shapes = [_draw_shape(rng, k, shape.rack_gpus) for k in drawn]
    if durations is not None:
        runs = rng.choice(run_pool(durations), size=gangs)
    else:
        runs = rng.exponential(mean_run, size=gangs)
    gpu_seconds = sum(m * g * r for (m, g, _), r in zip(shapes, runs, strict=True))
    span = gpu_seconds / (shape.total_gpus * load)
    starts = np.cumsum(rng.exponential(span / gangs, size=gangs))
    out: list[Gang] = []
    for n, (kind, (members, g, size), start, run) in enumerate(
        zip(drawn, shapes, starts, runs, strict=True)
    ):
        name = f"tg-{seed}-{n:05d}"
        out.append(make_gang(name, kind, members, g, size, created=float(start), run=float(run)))
    return out


# ------------------------------------------------------------------ reference rules
Plan = list[int]
"""A node index per member."""


def _required_key(gang: Gang) -> str | None:
    return gang.spec.topology_key


def kube_tas(layout: Layout, free: IntArray, gang: Gang) -> Plan | None:
    """kube-scheduler 1.37's topology-aware workload scheduling (KEP-5732, alpha), from its
    description: one *required* topology key; a candidate placement per domain of it (the
    whole cluster without a key; a preference cannot be expressed, so it counts as none);
    in each placement the members are scheduled one by one, each to the node NodeResources
    Fit's MostAllocated scores highest (GPUs decide here: the node left with the fewest
    free GPUs, ties by node order); a placement is feasible when every member lands; the
    feasible placement scored highest (the fewest free GPUs left in its domain afterwards,
    the tightest fit; with domains of equal size, the most allocated) wins, ties by
    domain order. Slices have no place in it either: a sliced gang is asked of one domain
    of its slice level as a whole, the only way one key keeps every slice in one domain."""
    key = _required_key(gang) or gang.spec.slice_key
    if key is None:
        candidates = [np.arange(len(free))]
    else:
        dom = layout.levels[layout.level(key)]
        candidates = [
            np.flatnonzero(dom == d) for d in range(len(layout.values[layout.level(key)]))
        ]
    best: tuple[int, Plan] | None = None
    for nodes in candidates:
        left = free[nodes].copy()
        plan: Plan = []
        for _ in range(gang.members):
            ok = np.flatnonzero(left >= gang.gpus)
            if not len(ok):
                break
            pick = int(ok[np.argmin(left[ok])])  # argmin: first of the ties
            left[pick] -= gang.gpus
            plan.append(int(nodes[pick]))
        if len(plan) < gang.members:
            continue
        score = -int(left.sum())  # the fewest free GPUs left: the tightest fit
        if best is None or score > best[0]:
            best = (score, plan)
    return None if best is None else best[1]


def _best_fit_pick(caps: Mapping[int, int], need: int) -> dict[int, int]:
    """Kueue's BestFit over sibling domains: most room first while no single remaining
    domain holds the rest, then the one with the least room that still does (the last).
    ``{domain: units}``; empty when they do not add up to ``need``."""
    if need <= 0 or sum(caps.values()) < need:
        return {}
    remaining = sorted(caps, key=lambda d: (-caps[d], d))
    chosen: dict[int, int] = {}
    left = need
    while True:
        holding = [e for e in remaining if caps[e] >= left]
        if holding:
            chosen[min(holding, key=lambda e: (caps[e], e))] = left
            return chosen
        d = remaining.pop(0)
        chosen[d] = caps[d]
        left -= caps[d]


def kueue_best_fit(layout: Layout, free: IntArray, gang: Gang) -> Plan | None:
    """Kueue's TAS with its BestFit profile (KEP-2724, "Computing the assignment"), from its
    description. Room is counted in members per node (``free // gpus``) and, at the slice
    level and above, in whole slices (a slice-level domain holds ``members // size`` of
    them). Required level: among its domains that hold the gang, the one with the least
    room (BestFit's choice of a single domain). Preferred level: the search starts there
    and goes one level up while no single domain holds the gang; the tightest domain that
    holds it is taken; past the top level the gang spreads over top-level domains. Below
    the chosen domain(s) each level is filled BestFit: most room first, the last domain
    the one with the least room that still holds the rest, down to the nodes. A sliced
    gang is split in whole slices down to the slice level, in members below it."""
    room = free // gang.gpus
    unit = gang.unit
    slice_level = layout.level(gang.spec.slice_key) if gang.spec.slice_key else None

    def caps(level: int, nodes: IntArray) -> dict[int, int]:
        """Units each domain of ``level`` among ``nodes`` holds."""
        dom = layout.levels[level]
        out: dict[int, int] = {}
        if slice_level is not None and level <= slice_level:
            sdom = layout.levels[slice_level]
            per_slice = np.bincount(sdom[nodes], weights=room[nodes])
            for s in np.unique(sdom[nodes]).tolist():
                top = int(dom[nodes][sdom[nodes] == s][0])
                out[top] = out.get(top, 0) + int(per_slice[s]) // unit
            return {d: c for d, c in out.items() if c > 0}
        per = np.bincount(dom[nodes], weights=room[nodes])
        return {int(d): int(per[d]) for d in np.unique(dom[nodes]).tolist() if per[d] > 0}

    def descend(level: int, nodes: IntArray, units: int) -> Plan | None:
        """Place ``units`` inside ``nodes`` (one domain of ``level - 1``), level by level."""
        if slice_level is not None and level == slice_level + 1:
            units *= unit  # below the slice level, members
        if level == len(LEVELS):  # one node
            return [int(nodes[0])] * units
        c = caps(level, nodes)
        picked = _best_fit_pick(c, units)
        if not picked:
            return None
        plan: Plan = []
        dom = layout.levels[level]
        for d, n in sorted(picked.items()):
            sub = descend(level + 1, nodes[dom[nodes] == d], n)
            if sub is None:
                return None
            plan += sub
        return plan

    every = np.arange(len(free))
    need = gang.members // unit
    required = _required_key(gang)
    if required is not None:
        level = layout.level(required)
        c = caps(level, every)
        holding = [d for d, n in c.items() if n >= need]
        if not holding:
            return None
        d = min(holding, key=lambda e: (c[e], e))
        return descend(level + 1, every[layout.levels[level] == d], need)
    start = layout.level(gang.preferred) if gang.preferred else len(LEVELS) - 1
    for level in range(start, -1, -1):
        c = caps(level, every)
        holding = [d for d, n in c.items() if n >= need]
        if holding:
            d = min(holding, key=lambda e: (c[e], e))
            return descend(level + 1, every[layout.levels[level] == d], need)
    return descend(0, every, need)


# ---------------------------------------------------------------------------- replay
@dataclass(slots=True)
class PolicyResult:
    """What one policy made of the stream."""

    policy: str
    gangs: int = 0
    admitted: int = 0
    given_up: int = 0
    admitted_by_kind: Counter[str] = field(default_factory=Counter)
    arrived_by_kind: Counter[str] = field(default_factory=Counter)
    allocated_pct_time: float = 0.0
    spans: list[tuple[int, int]] = field(default_factory=list)
    """(domains spanned at the preferred level, fewest possible then) per admitted gang
    with a preferred level."""
    waits: list[float] = field(default_factory=list)
    attempts: int = 0
    short: int = 0
    """Attempts skipped by the necessary condition."""
    recheck_failed: int = 0
    seconds: float = 0.0
    placements: list[tuple[int, float, tuple[str, ...]]] = field(default_factory=list)
    """(gang index, time, node of each member) per admission, when recorded."""

    def wait_pct(self, q: float) -> float | None:
        return float(np.percentile(self.waits, q)) if self.waits else None

    @property
    def mean_spanned(self) -> float | None:
        return float(np.mean([s for s, _ in self.spans])) if self.spans else None

    @property
    def mean_fewest(self) -> float | None:
        return float(np.mean([m for _, m in self.spans])) if self.spans else None

    @property
    def excess(self) -> float | None:
        """Mean domains spanned beyond the fewest possible."""
        return float(np.mean([s - m for s, m in self.spans])) if self.spans else None

    @property
    def at_fewest_pct(self) -> float | None:
        """Share of preferred gangs that spanned the fewest domains possible then (#37's
        acceptance asks >= 95 %)."""
        if not self.spans:
            return None
        return 100 * float(np.mean([s <= m for s, m in self.spans]))

    def to_json(self) -> dict[str, Any]:
        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 3)

        return {
            "policy": self.policy,
            "gangs": {"arrived": self.gangs, "admitted": self.admitted, "givenUp": self.given_up},
            "admittedByKind": {
                k: [self.admitted_by_kind[k], self.arrived_by_kind[k]]
                for k in KINDS
                if self.arrived_by_kind[k]
            },
            "allocatedGpuPercentTimeAvg": round(self.allocated_pct_time, 3),
            "preferredDomainsSpanned": r(self.mean_spanned),
            "preferredDomainsFewest": r(self.mean_fewest),
            "preferredDomainsExcess": r(self.excess),
            "preferredAtFewestPercent": r(self.at_fewest_pct),
            "waitP50Seconds": r(self.wait_pct(50)),
            "waitP99Seconds": r(self.wait_pct(99)),
            "attempts": self.attempts,
            "tooLittleRoom": self.short,
            "recheckFailed": self.recheck_failed,
            "seconds": round(self.seconds, 3),
        }


PolicyFn = Callable[[Snapshot, TopologyState, IntArray, Gang, int], Plan | None]
"""(snapshot, device and GPU-demand state, free GPUs per node, gang, seed) -> node index
per member, or None."""


def _reference(rule: Callable[[Layout, IntArray, Gang], Plan | None], layout: Layout) -> PolicyFn:
    def run(
        snapshot: Snapshot, topology: TopologyState, free: IntArray, gang: Gang, seed: int
    ) -> Plan | None:
        del snapshot, topology, seed
        return rule(layout, free, gang)

    return run


def _lattice(use_solver: bool, time_limit_s: float) -> PolicyFn:
    framework = Framework(DEFAULT_PROFILE)

    def run(
        snapshot: Snapshot, topology: TopologyState, free: IntArray, gang: Gang, seed: int
    ) -> Plan | None:
        del free
        problem = build_problem(
            framework,
            snapshot,
            gang.spec,
            gang.pods,
            need=gang.members,
            topology=topology,
            levels=LEVELS,
            seed=seed,
        )
        plan = solve(problem, time_limit_s=time_limit_s, seed=seed, use_solver=use_solver)
        if not plan.admitted:
            return None
        out = [-1] * gang.members
        for index, node in plan.placements:
            where = snapshot.index_of(node)
            assert where is not None
            out[index] = where
        return out if min(out) >= 0 else None

    return run


def policy_fn(name: str, layout: Layout, *, time_limit_s: float = 1.0) -> PolicyFn:
    if name == LATTICE:
        return _lattice(True, time_limit_s)
    if name == GREEDY:
        return _lattice(False, time_limit_s)
    if name == KUBE_TAS:
        return _reference(kube_tas, layout)
    if name == KUEUE:
        return _reference(kueue_best_fit, layout)
    raise ValueError(f"unknown policy {name!r}; one of {', '.join(POLICIES)}")


def may_fit(layout: Layout, free: IntArray, gang: Gang) -> bool:
    """Necessary for any policy: room for the members in total, in one rack for a
    required rack, in whole slices of their slice level for slices."""
    room = free // gang.gpus
    if int(room.sum()) < gang.members:
        return False
    key = gang.spec.topology_key or gang.spec.slice_key
    if key is None:
        return True
    per = np.bincount(layout.levels[layout.level(key)], weights=room).astype(np.int64)
    if gang.spec.topology_key is not None:
        return int(per.max()) >= gang.members
    return int((per // gang.unit).sum()) * gang.unit >= gang.members


def fewest_domains(layout: Layout, free: IntArray, gang: Gang) -> int | None:
    """The fewest domains of the gang's preferred level the free GPUs could hold it in (in
    whole slices when sliced)."""
    if gang.preferred is None:
        return None
    room = free // gang.gpus
    level = layout.level(gang.preferred)
    dom = layout.levels[level]
    if gang.spec.slice_key is not None:
        sdom = layout.levels[layout.level(gang.spec.slice_key)]
        per_slice = np.bincount(sdom, weights=room).astype(np.int64) // gang.unit
        parent = {int(s): int(dom[np.flatnonzero(sdom == s)[0]]) for s in np.unique(sdom)}
        caps: dict[int, int] = {}
        for s, d in parent.items():
            caps[d] = caps.get(d, 0) + int(per_slice[s])
        return fewest(caps, gang.members // gang.unit)
    per = np.bincount(dom, weights=room).astype(np.int64)
    return fewest({d: int(c) for d, c in enumerate(per.tolist())}, gang.members)


def _free_gpus(snapshot: Snapshot) -> IntArray:
    col = snapshot.resource_column(GPU_RESOURCE)
    assert col is not None
    left: IntArray = np.maximum(snapshot.allocatable[col] - snapshot.requested[col], 0)
    return left


def replay_policy(
    nodes: Sequence[Node],
    gangs: Sequence[Gang],
    policy: str,
    *,
    patience: float,
    seed: int = 0,
    time_limit_s: float = 1.0,
    record: bool = False,
    on_gang: Callable[[], object] | None = None,
) -> PolicyResult:
    """Replay ``gangs`` under ``policy`` on a fresh cluster of ``nodes`` (module docstring).
    ``record``: keep every admission's nodes in ``placements``."""
    result = PolicyResult(policy)
    layout = Layout.of(nodes)
    place_fn = policy_fn(policy, layout, time_limit_s=time_limit_s)
    snapshot = Snapshot(list(nodes), [])
    # As the controller keeps it: the GPU request mix learns every pending member (the
    # fragmentation term of Lattice's objective reads it); the reference rules ignore it.
    topology = TopologyState(DEFAULT_PROFILE.topology)
    topology.gpu_demand.set_resources(DEFAULT_PROFILE.gpu_placement.resources)
    total = int(_free_gpus(snapshot).sum())
    clock = _AllocationClock(0)
    leaving: list[tuple[float, int]] = []
    waiting: dict[int, Gang] = {}
    started = time.perf_counter()

    def attempt(n: int, gang: Gang, now: float) -> bool:
        free = _free_gpus(snapshot)
        if not may_fit(layout, free, gang):
            result.short += 1
            return False
        result.attempts += 1
        plan = place_fn(snapshot, topology, free, gang, seed * 100_003 + n)
        if plan is None:
            return False
        used = np.bincount(plan, minlength=len(free)) * gang.gpus
        if len(plan) != gang.members or bool((used > free).any()):
            result.recheck_failed += 1
            return False
        fewest_then = fewest_domains(layout, free, gang)
        for pod, where in zip(gang.pods, plan, strict=True):
            snapshot.add_pod(pod, layout.names[where])
            topology.pod_placed(pod, layout.names[where])
            topology.gpu_demand.set_pending(pod.key, None)
        if gang.preferred is not None and fewest_then is not None:
            dom = layout.levels[layout.level(gang.preferred)]
            result.spans.append((len({int(dom[i]) for i in plan}), fewest_then))
        if record:
            result.placements.append((n, now, tuple(layout.names[i] for i in plan)))
        clock.move(now, gang.total_gpus)
        heapq.heappush(leaving, (now + gang.run, n))
        result.admitted += 1
        result.admitted_by_kind[gang.kind] += 1
        result.waits.append(now - gang.created)
        return True

    def give_up(now: float) -> None:
        for n, gang in list(waiting.items()):
            if gang.created + patience <= now:
                del waiting[n]
                result.given_up += 1
                for pod in gang.pods:
                    topology.gpu_demand.set_pending(pod.key, None)

    def advance(now: float) -> None:
        while leaving and leaving[0][0] <= now:
            when, gone = heapq.heappop(leaving)
            for pod in gangs[gone].pods:
                snapshot.remove_pod(pod)
                topology.pod_removed(pod.key)
            clock.move(when, -gangs[gone].total_gpus)
            give_up(when)
            for n, waiter in list(waiting.items()):
                if attempt(n, waiter, when):
                    del waiting[n]
        give_up(now)

    for n, gang in enumerate(gangs):
        advance(gang.created)
        result.gangs += 1
        result.arrived_by_kind[gang.kind] += 1
        clock.move(gang.created, 0)
        for pod in gang.pods:
            topology.gpu_demand.set_pending(pod.key, pod)
        if not attempt(n, gang, gang.created):
            waiting[n] = gang
        if on_gang is not None:
            on_gang()
    if gangs:
        last = gangs[-1].created
        result.allocated_pct_time = 100 * clock.mean(last) / total
        advance(last + patience)
    result.given_up += len(waiting)
    result.seconds = time.perf_counter() - started
    return result


@dataclass(frozen=True, slots=True)
class SeedRun:
    seed: int
    gangs: int
    results: tuple[PolicyResult, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "gangs": self.gangs,
            "policies": [r.to_json() for r in self.results],
        }


def compare(
    shape: Shape,
    *,
    seeds: Sequence[int],
    gangs: int,
    load: float,
    patience: float | None = None,
    mean_run: float = 3600.0,
    durations: Sequence[float] | None = None,
    mix: Mapping[str, float] | None = None,
    policies: Sequence[str] = POLICIES,
    time_limit_s: float = 1.0,
    on_run: Callable[[SeedRun], object] | None = None,
    progress: bool = False,
) -> list[SeedRun]:
    """Every policy over the stream of each seed. ``patience`` None: the mean run time."""
    nodes = topology_cluster(shape)
    runs: list[SeedRun] = []
    for seed in seeds:
        stream = topology_stream(
            shape,
            gangs=gangs,
            load=load,
            seed=seed,
            mix=mix,
            mean_run=mean_run,
            durations=durations,
        )
        wait = float(np.mean([g.run for g in stream])) if patience is None else patience
        results = []
        for policy in policies:
            bar: Any = None
            if progress:
                from tqdm import tqdm

                bar = tqdm(total=len(stream), desc=f"seed {seed} {policy}", unit="gang")
            results.append(
                replay_policy(
                    nodes,
                    stream,
                    policy,
                    patience=wait,
                    seed=seed,
                    time_limit_s=time_limit_s,
                    on_gang=None if bar is None else bar.update,
                )
            )
            if bar is not None:
                bar.close()
        run = SeedRun(seed, len(stream), tuple(results))
        runs.append(run)
        if on_run is not None:
            on_run(run)
    return runs


COLUMNS: Final = (
    "seed",
    "policy",
    "gangs admitted",
    "GPU alloc % (time avg)",
    "pref. domains spanned",
    "fewest possible",
    "excess",
    "at fewest %",
    "wait p50 s",
    "wait p99 s",
    "s",
)


def _f(v: float | None, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def format_rows(runs: Sequence[SeedRun]) -> str:
    """One row per seed and policy, then a mean per policy over the seeds, aligned."""
    rows: list[tuple[str, ...]] = [COLUMNS]
    by_policy: dict[str, list[PolicyResult]] = {}
    for run in runs:
        for r in run.results:
            by_policy.setdefault(r.policy, []).append(r)
            rows.append(
                (
                    str(run.seed),
                    r.policy,
                    f"{r.admitted}/{r.gangs}",
                    f"{r.allocated_pct_time:.1f}",
                    _f(r.mean_spanned, 2),
                    _f(r.mean_fewest, 2),
                    _f(r.excess, 2),
                    _f(r.at_fewest_pct, 0),
                    _f(r.wait_pct(50), 0),
                    _f(r.wait_pct(99), 0),
                    f"{r.seconds:.0f}",
                )
            )
    if len(runs) > 1:
        for policy, results in by_policy.items():

            def mean(values: list[float | None]) -> float | None:
                got = [v for v in values if v is not None]
                return float(np.mean(got)) if got else None

            rows.append(
                (
                    "mean",
                    policy,
                    f"{np.mean([r.admitted for r in results]):.1f}/"
                    f"{np.mean([r.gangs for r in results]):.0f}",
                    f"{np.mean([r.allocated_pct_time for r in results]):.1f}",
                    _f(mean([r.mean_spanned for r in results]), 2),
                    _f(mean([r.mean_fewest for r in results]), 2),
                    _f(mean([r.excess for r in results]), 2),
                    _f(mean([r.at_fewest_pct for r in results]), 0),
                    _f(mean([r.wait_pct(50) for r in results]), 0),
                    _f(mean([r.wait_pct(99) for r in results]), 0),
                    f"{sum(r.seconds for r in results):.0f}",
                )
            )
    widths = [max(len(row[c]) for row in rows) for c in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )

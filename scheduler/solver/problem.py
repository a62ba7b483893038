"""From one snapshot and a gang's pending members to a :class:`GangProblem` of plain arrays.

Theory of operation
-------------------
``build_problem`` runs on the event loop, where the snapshot is consistent; everything the
solve needs is copied out into numpy arrays and tuples, so :func:`scheduler.solver.solve`
can run in a worker thread while the loop keeps mutating the cache.

1. **minResources pre-check**: when the cluster's total free capacity is below
   ``GangSpec.min_resources`` the problem carries a rejection and nothing else is computed.
2. **Member classes**: two members are one class when the framework and the model cannot
   tell them apart: their :class:`~scheduler.model.pod.Pod` records are equal once name and
   uid are blanked, labels are cut down to the keys some label selector can read (the
   members' own pod-affinity and spread terms, and the affinity terms of placed pods — the
   only readers of an incoming pod's labels) and annotations to Lattice's ``lattice.dev/``
   keys (the only ones the core reads). Anything else that differs, the pods are not
   merged. The framework then runs once per class, with every filter and score.
3. **Nodes**: only nodes feasible for some class are kept ("local" nodes, in snapshot row
   order). Per class and local node, ``limit`` is the most members of that class the node
   takes on its own: free capacity per requested resource, free pod slots, one for host
   ports, what the Topology plugin can align one after another (simulated with its own
   placement on the node's device ledger plus the members already chosen), and what the
   node's free DRA devices hold of the class's claims one member after another (the
   allocator DynamicResources runs, each simulated member's devices counted as used; the
   members' own template claims are compared by spec, so one template is one class).
4. **Joint rules between members**, which per-member feasibility cannot see: inter-pod
   required anti-affinity among members (per domain of the term's key), required affinity
   of a member that starts its own group (no placed pod matches it yet: members that match
   the term are kept in one domain, a conservative reading), required affinity of a
   *follower* that selects other members but not itself (an MPI job's workers with affinity
   to their launcher: the framework runs it without that affinity; the model keeps it in
   one domain with the members it selects and places it only with one of them, which the
   commit places first), hard topology spread over the
   final counts (placed pods plus matched members), host-port conflicts, and device
   exclusivity (a node where an aligned member could lose its alignment to another class's
   devices takes one Topology-using class only; a class that allocates DRA devices counts
   as such a class). Capacity between classes is the model's.
5. **Objective weights** (:class:`Weights`) make one integer objective lexicographic:
   placed members, then members on nodes no preference passes over, then the total
   framework score, then the GPUs kept usable: per GPU node, the fragmentation
   (:mod:`scheduler.core.gpus`, the request mix GPUPlacement scores single pods by) that
   the gang's GPUs there leave, as the table :attr:`GangProblem.keep`. The same measure
   for gangs and single pods, so a gang leaves the cluster as placeable for the next big
   job as single pods do.

Not modelled: LoadAware *thresholds* between members (off by default; each member is
checked alone) and preferred (soft) rules between members.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from scheduler.core.dra.allocator import (
    AllocationError,
    Allocator,
    BudgetExhausted,
    NodeAllocationError,
)
from scheduler.core.dra.extended import SINCE_MINOR as DRA_EXTENDED_SINCE
from scheduler.core.dra.objects import DeviceId
from scheduler.core.dra.search import ON_LOOP_BUDGET, SEARCH_BUDGET
from scheduler.core.dra.state import DraState
from scheduler.core.explain import Decision
from scheduler.core.framework import Cycle
from scheduler.core.gpus import Free, GpuDemand, SizeClass, fragmentation
from scheduler.core.load import LoadView
from scheduler.core.nominated import nominated_by_node, nominee_devices_held
from scheduler.core.plugins import pod_topology_spread as spread_plugin
from scheduler.core.plugins.dynamic_resources import (
    DynamicResources,
    extended_claims,
    unallocated_claims,
)
from scheduler.core.plugins.inter_pod_affinity import incoming_term_matches, required_state
from scheduler.core.plugins.node_ports import conflicts
from scheduler.core.plugins.topology import Placement, Topology
from scheduler.core.profile import GpuAlignment
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import BoolArray, IndexArray, IntArray, Snapshot
from scheduler.core.topology.allocate import free_state
from scheduler.core.topology.ledger import Holding
from scheduler.core.topology.request import InvalidTopologyRequest, TopologyRequest
from scheduler.core.topology.state import TopologyState
from scheduler.core.volumes import VolumeState
from scheduler.model.gang import GangSpec
from scheduler.model.names import CPU, PODS, is_dra_extended_resource, is_extended_resource
from scheduler.model.pod import Pod, PodAffinityTerm, UnsatisfiableAction
from scheduler.model.release import DEFAULT_KUBE_MINOR
from scheduler.model.selectors import LabelSelector

UNLIMITED: Final = 1 << 30
"""A per-node member limit that no gang reaches."""
READ_ANNOTATION_PREFIX: Final = "lattice.dev/"
"""The only pod annotations the scheduling core reads (Topology's requests)."""


@dataclass(frozen=True, slots=True)
class MemberReport:
    """One member's view for ``lattice explain`` and events."""

    index: int
    """Index into the ``members`` given to :func:`build_problem`."""
    pod: str
    """``namespace/name``."""
    key: str
    """:attr:`Pod.key` (the uid): the cache identity the binder and queue use."""
    member_class: int
    feasible_nodes: int
    rejecting_plugins: tuple[str, ...]
    summary: str
    """The framework's kube-style summary for this member alone."""
    node: str | None = None
    score: int | None = None
    """The framework's weighted total on :attr:`node`."""


@dataclass(frozen=True, slots=True, eq=False)
class MemberClass:
    """Members the framework and the model cannot tell apart."""

    members: tuple[int, ...]
    """Member indices, arrival order."""
    summary: str
    rejecting_plugins: tuple[str, ...]
    feasible_nodes: int
    """Feasible nodes in the snapshot (before joint rules such as one-domain)."""
    host_ports: bool
    topology_active: bool
    """The Topology plugin places devices (or pinned CPUs) for this class."""
    aligned: bool
    """Its Topology placement can fail when devices are taken (required alignment)."""

    @property
    def size(self) -> int:
        return len(self.members)


@dataclass(frozen=True, slots=True, eq=False)
class AntiAffinity:
    """Members of ``cls`` share no domain of ``key`` with members of ``matched``."""

    cls: int
    matched: tuple[int, ...]
    """Classes the term selects (``cls`` itself included when it selects itself)."""
    key: str
    domain: IntArray
    """Per local node, the value id of ``key`` (-1: label absent, the term ignores it)."""


@dataclass(frozen=True, slots=True, eq=False)
class Together:
    """Placed members of ``classes`` all in one domain of ``key``, never on a node without
    ``key`` (kube: such a node satisfies no required affinity term, nor counts as a match).

    With a ``follower``: that class's required affinity selects ``anchors`` (other classes)
    but not itself, and no placed pod matches it yet (an MPI launcher's workers): kube admits
    a follower only next to a placed anchor, so it is placed only when some member of
    ``anchors`` is (in the group's one domain), and committed after one."""

    classes: tuple[int, ...]
    key: str
    domain: IntArray
    follower: int | None = None
    anchors: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, eq=False)
class Spread:
    """A hard topology spread constraint of ``cls`` that selects gang members.

    Checked on the final counts: for every domain holding a member of ``cls``,
    ``existing + matched members there - min over eligible domains <= max_skew``.
    """

    cls: int
    matched: tuple[int, ...]
    key: str
    max_skew: int
    domain: IntArray
    """Per local node, the value id of ``key`` (-1: absent)."""
    counted: BoolArray
    """Per local node: members placed there count (the constraint's inclusion policies)."""
    existing: IntArray
    """Per value id, matching placed pods on counted nodes."""
    eligible: BoolArray
    """Per value id: a domain the global minimum is taken over."""
    min_zero: bool
    """Fewer eligible domains than minDomains: the minimum is 0."""


@dataclass(frozen=True, slots=True, eq=False)
class Level:
    """The domains of one node label key over the local nodes, numbered densely.

    A node without the label is a domain of its own (ids after the labelled ones): a
    preference counts it as one more domain spanned rather than ruling it out."""

    key: str
    domain: IntArray
    """Per local node, its domain id (every node has one)."""
    names: tuple[str, ...]
    """The label value per labelled domain id."""

    @property
    def size(self) -> int:
        return int(self.domain.max(initial=-1)) + 1

    def name(self, d: int) -> str:
        return f"{self.key}={self.names[d]}" if d < len(self.names) else f"{self.key} (unset)"


@dataclass(frozen=True, slots=True, eq=False)
class EmptyDomains:
    """The domains of one level below the tight one whose GPUs are all free."""

    level: Level
    room: IntArray
    """Per domain id of :attr:`level`, its free GPUs (0 for a domain not empty)."""

    @property
    def ids(self) -> IntArray:
        out: IntArray = np.flatnonzero(self.room > 0)
        return out


@dataclass(frozen=True, slots=True)
class Weights:
    """Coefficients of the lexicographic objective (each tier outweighs all below it)."""

    placed: int
    preferred: int
    score: int
    whole: int = 1
    spans: tuple[int, ...] = ()
    """Per level of :attr:`GangProblem.compact`: each domain of it left unused."""
    tight: int = 0
    """Per unit of :attr:`GangProblem.tight_rank` of the tight domains left unused."""
    pack: int = 0
    """Per unit of :attr:`GangProblem.pack` (members in the fuller domains below the tight
    level)."""
    whole_domains: int = 0
    """Per empty domain below the tight level left untouched or filled whole
    (:attr:`GangProblem.empty`)."""


@dataclass(frozen=True, eq=False)
class GangProblem:
    """Everything a solve reads, copied out of the snapshot (safe in another thread)."""

    gang: str
    need: int
    members: tuple[str, ...]
    """``namespace/name`` per member."""
    member_class: tuple[int, ...]
    classes: tuple[MemberClass, ...]
    node_names: tuple[str, ...]
    """Local nodes (feasible for some class), snapshot row order."""
    resources: tuple[str, ...]
    request: IntArray
    """(classes, resources) requested amounts."""
    free: IntArray
    """(resources, local nodes) allocatable minus requested (may be negative)."""
    free_pods: IntArray
    limit: IntArray
    """(classes, local nodes) most members of the class on the node alone; 0 = infeasible."""
    score: IntArray
    """(classes, local nodes) framework weighted totals."""
    preferred: BoolArray
    """(classes, local nodes) no applied preference passes the node over."""
    gpus: IntArray
    """GPUs requested per class."""
    gpu_alloc: IntArray
    gpu_free: IntArray
    frag_nodes: BoolArray
    """Local nodes whose GPU fragmentation the objective counts."""
    keep: IntArray
    """(local nodes, most free GPUs + 1): the objective's last tier per node by GPUs the gang
    uses there, ``max - fragmentation after`` in thousandths of a GPU (0 off frag nodes)."""
    topology_key: str | None
    domain: IntArray
    """Per local node, the value id of ``topology_key`` (-1: absent or no key)."""
    domain_names: tuple[str, ...]
    anti: tuple[AntiAffinity, ...]
    together: tuple[Together, ...]
    spreads: tuple[Spread, ...]
    port_conflicts: BoolArray
    """(classes, classes) members of the two classes cannot share a node."""
    device_exclusive: BoolArray
    """Per local node: at most one Topology-using class may use it."""
    weights: Weights
    reports: tuple[MemberReport, ...]
    rejection: str | None = None
    """Set when the pre-check already rejects the gang."""
    build_time_s: float = 0.0
    rank: tuple[int, ...] = ()
    """Per class, its commit rank: 0, or one more than an anchor's (followers after the
    members they need, see :class:`Together`). Empty: every class 0."""
    compact: tuple[Level, ...] = ()
    """The preferred level's chain: the wider levels of ``spec.topology.levels`` (within
    the required one), widest first, then the preferred level. The objective counts the
    domains each one spans, the preferred level's first, then from the widest down."""
    tight: Level | None = None
    """The level whose chosen domains should be the fullest that still fit (BestFit): the
    preferred one, else the required one."""
    tight_rank: IntArray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    """Per domain of :attr:`tight`, the dense rank of the members it can hold (1: fewest)."""
    capacity: IntArray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    """Per local node, members of the gang it can hold on its own (capped at the gang's
    size): the per-domain capacity the tight ranks and the domain choice read."""
    slice_size: int = 0
    """Members per slice (0: no slices): each slice on nodes of one domain of
    :attr:`slicing`, so the members placed in a domain are the :attr:`slice_short` there
    and a multiple of it."""
    slicing: Level | None = None
    """The slice level (labelled nodes only: others get no member)."""
    slice_short: IntArray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    """Per domain of :attr:`slicing`, the members its bound members' slices there are
    short of (a partial gang): placed there before any new slice."""
    slice_bound: tuple[tuple[int, int], ...] = ()
    """(domain of :attr:`slicing`, slice) per member bound already: a partial gang's rest
    completes their slices first."""
    spanned: tuple[tuple[int, ...], ...] = ()
    """Per level of :attr:`compact`, the domains members bound already use (a partial
    gang): counted as spanned whatever the plan, so the rest joins them at no cost."""
    tight_spanned: tuple[int, ...] = ()
    """The domains of :attr:`tight` bound members use: their ranks are spent already."""
    empty: tuple[EmptyDomains, ...] = ()
    """Per level between the tight level and the node, its domains with every GPU free:
    the objective counts those the gang leaves untouched or fills whole, so a gang that
    needs less than a rack takes a rack's crumbs, not a whole rack's corner, and whole
    racks stay for the gangs and slices that need them (Kueue's BestFit fills a level
    most-room-first and the last domain best fit, to the same end)."""
    pack: IntArray = dataclasses.field(default_factory=lambda: np.zeros((0, 0), np.int64))
    """(classes, local nodes) the pack tier's value of one member there: its GPUs (1 without
    GPUs) times the number of distinct rooms above its domain's, summed over the levels
    between the tight level and the node. Members go to the fullest domains that hold them,
    so whole racks stay whole for the gangs that need them (Kueue's BestFit below its
    chosen domain). Empty: no such tier."""

    @property
    def num_nodes(self) -> int:
        return len(self.node_names)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def sizes(self) -> IntArray:
        return np.array([c.size for c in self.classes], dtype=np.int64)


def build_problem(
    framework: Framework,
    snapshot: Snapshot,
    gang: GangSpec,
    members: Sequence[Pod],
    *,
    need: int,
    topology: TopologyState | None = None,
    load: LoadView | None = None,
    seed: int = 0,
    merge: bool = True,
    volumes: VolumeState | None = None,
    nominated: Sequence[tuple[Pod, str]] = (),
    dra: DraState | None = None,
    levels: Sequence[str] = (),
    home: str | None = None,
    slice_bound: Sequence[tuple[str, int]] = (),
    bound_nodes: Sequence[str] = (),
) -> GangProblem:
    """Run the framework once per member class and copy out what the solve needs.
    ``volumes``: the cluster's storage, for members with (bound) claims; ``dra``: the
    cluster's DRA objects, for members with resource claims (each member's own claims,
    from a template or by name, or an allocated claim they share).

    ``need``: members that must be placed now (1..len(members)); the solve places more when
    they fit. ``levels``: ``spec.topology.levels`` (widest first). ``home``: the value of
    the gang's required key where members are bound already (a partial gang): the rest
    may go nowhere else. ``slice_bound``: with slices, (value of the slice level, slice) per
    member bound already (a partial gang's rest completes their slices). ``bound_nodes``:
    the nodes of members bound already; at a preferred level their domains count as
    spanned, so the rest goes near them where it fits. ``merge=False``
    gives every member its own class (the naive reference).

    ``nominated``: pending pods and their ``status.nominatedNodeName`` (waiting for their
    preemption's victims). As kube's filters count them for a pod of lower or equal priority
    (``RunFilterPluginsWithNominatedPods``), those of priority >= the lowest member's hold
    their nodes for this solve: the problem is built with them placed there (capacity, pod
    slots, ports, affinity and spread counts), and a node is kept for a class only if the
    class also passes it without them. The gang's own members' nominations are left out
    (its plan replaces them), as the commit's re-check leaves them out. Conservative: a
    member of higher priority than some counted nomination would be let through by the
    commit where the solve kept out; the solve never plans what the commit refuses for a
    nomination, except where kube adds each node's nominated pods alone and the spread
    minimum moves with them all (rare; the commit then fails as a race).
    """
    started = time.perf_counter()
    if not 1 <= need <= len(members):
        raise ValueError(f"need must be within 1..{len(members)}, got {need}")
    problem = _nominated_build(
        framework,
        snapshot,
        gang,
        members,
        need,
        topology,
        load,
        seed,
        merge,
        volumes,
        nominated,
        dra,
    )
    if problem.rejection is None and home is not None and problem.topology_key is not None:
        # Members bound already fix the required domain for the rest.
        ids = [d for d, value in enumerate(problem.domain_names) if value == home]
        limit = problem.limit.copy()
        limit[:, ~np.isin(problem.domain, ids)] = 0
        problem = dataclasses.replace(problem, limit=limit)
    if problem.rejection is None:
        problem = _with_levels(
            problem, snapshot, gang, levels, framework.profile.topology.gpu_resource, bound_nodes
        )
    if problem.rejection is None and gang.slice_size and gang.slice_key:
        problem = _with_slices(problem, snapshot, gang, levels, slice_bound)
    return dataclasses.replace(problem, build_time_s=time.perf_counter() - started)


def _nominated_build(
    framework: Framework,
    snapshot: Snapshot,
    gang: GangSpec,
    members: Sequence[Pod],
    need: int,
    topology: TopologyState | None,
    load: LoadView | None,
    seed: int,
    merge: bool,
    volumes: VolumeState | None,
    nominated: Sequence[tuple[Pod, str]],
    dra: DraState | None,
) -> GangProblem:
    """:func:`_build` with the counted nominations placed (see :func:`build_problem`)."""
    counted = counted_nominations(snapshot, members, nominated)
    if not counted:
        return _build(
            framework,
            snapshot,
            gang,
            members,
            need,
            topology,
            load,
            seed,
            merge,
            volumes,
            None,
            dra,
        )
    _, _, _, without = _class_decisions(
        framework, snapshot, members, merge, topology, load, seed, volumes, dra
    )
    passes_without = [_feasible_mask(d) for d in without]
    added: list[Pod] = []
    lowest = min(members, key=lambda m: m.priority)
    devices = any(m.resource_claims for m in members)
    # The nominees' devices are held as in a single pod's cycle (the members' commit
    # re-checks count them too): planned before the nominees' pods are placed.
    held = nominee_devices_held(framework, snapshot, lowest, counted, dra, uses_devices=devices)
    with held:
        try:
            for pod, node in counted:
                snapshot.add_pod(pod, node)
                added.append(pod)
            problem = _build(
                framework,
                snapshot,
                gang,
                members,
                need,
                topology,
                load,
                seed,
                merge,
                volumes,
                passes_without,
                dra,
            )
        finally:
            for pod in added:
                snapshot.remove_pod(pod)
    return problem


def compact_keys(
    levels: Sequence[str], required: str | None, preferred: str | None
) -> tuple[str, ...]:
    """The preferred level's chain, widest first: the levels wider than ``preferred`` (and
    narrower than ``required`` when both are levels), then ``preferred``. Empty when there
    is no preference or the required level already implies it (it is the same or wider);
    a preferred key that is not a level is a chain of its own."""
    if preferred is None or preferred == required:
        return ()
    if preferred not in levels:
        return (preferred,)
    i = list(levels).index(preferred)
    start = 0
    if required is not None and required in levels:
        j = list(levels).index(required)
        if j >= i:
            return ()
        start = j + 1
    return (*levels[start:i], preferred)


def node_level(snapshot: Snapshot, key: str, union: IndexArray) -> Level:
    """Dense domain ids of ``key`` over the local nodes; unlabelled nodes alone."""
    ids = _domain_ids(snapshot, key, union)
    labelled = ids >= 0
    values, dense = np.unique(ids[labelled], return_inverse=True)
    out = np.empty(len(ids), dtype=np.int64)
    out[labelled] = dense.reshape(-1)
    out[~labelled] = len(values) + np.arange(int((~labelled).sum()), dtype=np.int64)
    column = snapshot.label_column(key)
    names = tuple(column.values[int(v)] for v in values.tolist()) if column is not None else ()
    return Level(key, out, names)


def member_capacity(p: GangProblem) -> IntArray:
    """Per local node, the most members of one class it holds by free resources and pod
    slots, capped at the gang's size: the same however members are merged into classes."""
    size = len(p.members)
    fits = np.full((p.num_classes, p.num_nodes), size, dtype=np.int64)
    for j in range(len(p.resources)):
        for c in np.flatnonzero(p.request[:, j] > 0).tolist():
            room = np.maximum(p.free[j], 0) // int(p.request[c, j])
            fits[c] = np.minimum(fits[c], room)
    fits = np.minimum(fits, np.maximum(p.free_pods, 0)[None, :])
    fits[p.limit == 0] = 0
    out: IntArray = fits.max(axis=0, initial=0)
    return out


def _with_levels(
    problem: GangProblem,
    snapshot: Snapshot,
    gang: GangSpec,
    levels: Sequence[str],
    gpu_resource: str,
    bound_nodes: Sequence[str] = (),
) -> GangProblem:
    """The gang's preferred-level chain and tight level, their tables and the weights
    with their tiers."""
    p = problem
    keys = compact_keys(levels, gang.topology_key, gang.topology_preferred)
    tight_key = keys[-1] if keys else gang.topology_key
    if tight_key is None or not p.num_nodes:
        return p
    index = np.array([snapshot.index_of(n) for n in p.node_names], dtype=np.intp)
    compact = tuple(node_level(snapshot, key, index) for key in keys)
    tight = compact[-1] if compact else node_level(snapshot, tight_key, index)
    capacity = member_capacity(p)
    per_domain = np.bincount(tight.domain, weights=capacity, minlength=tight.size)
    _, inverse = np.unique(per_domain.astype(np.int64), return_inverse=True)
    tight_rank = inverse.reshape(-1).astype(np.int64) + 1
    groups = [k.members for k in p.classes]
    finer = _domain_levels(p, snapshot, index, _finer_levels(levels, tight_key))
    pack = pack_table(p, finer, capacity)
    empty = empty_domains(p, snapshot, index, finer, gpu_resource)
    weights = _weights(
        members_best(p.score, p.limit, groups),
        len(p.members),
        p.keep,
        p.preferred,
        p.limit,
        spans=tuple(level.size for level in compact),
        tight=int(tight_rank.sum()),
        pack=_pack_bound(pack, p),
        whole_domains=sum(len(e.ids) for e in empty),
    )
    return dataclasses.replace(
        p,
        compact=compact,
        tight=tight,
        tight_rank=tight_rank,
        capacity=capacity,
        weights=weights,
        pack=pack,
        empty=empty,
        spanned=tuple(_bound_domains(snapshot, level, bound_nodes) for level in compact),
        tight_spanned=_bound_domains(snapshot, tight, bound_nodes),
    )


def _bound_domains(snapshot: Snapshot, level: Level, bound_nodes: Sequence[str]) -> tuple[int, ...]:
    """The domain ids of ``level`` (over the local nodes) holding a node of ``bound_nodes``
    by its label; a bound node's domain without a local node is out of the plan's reach."""
    values = set()
    for name in bound_nodes:
        node = snapshot.get_node(name)
        value = node.labels.get(level.key) if node is not None else None
        if value is not None:
            values.add(value)
    return tuple(sorted(d for d, name in enumerate(level.names) if name in values))


def _finer_levels(levels: Sequence[str], tight_key: str) -> tuple[str, ...]:
    """The configured levels narrower than the tight one (all of them when the tight key
    is not a level: a gang's own key says nothing of the levels)."""
    if tight_key not in levels:
        return ()
    return tuple(levels[list(levels).index(tight_key) + 1 :])


def pack_table(p: GangProblem, finer: Sequence[Level], capacity: IntArray) -> IntArray:
    """See :attr:`GangProblem.pack`. Room is free GPUs when the gang asks for GPUs, else
    members the nodes hold (``finer``: :func:`_domain_levels`)."""
    uses_gpus = bool((p.gpus > 0).any())
    room = np.maximum(p.gpu_free, 0) if uses_gpus else capacity
    unit = np.where(p.gpus > 0, p.gpus, 1) if uses_gpus else np.ones(p.num_classes, np.int64)
    per_node = np.zeros(p.num_nodes, dtype=np.int64)
    for level in finer:
        per_domain = np.bincount(level.domain, weights=room, minlength=level.size).astype(np.int64)
        # Ranks, not GPUs: the order is what counts, and it keeps the tier's range (and the
        # objective's magnitude) to the number of distinct rooms.
        rooms, rank = np.unique(per_domain, return_inverse=True)
        per_node += (len(rooms) - 1 - rank.reshape(-1))[level.domain]
    if not per_node.any():
        return np.zeros((0, 0), dtype=np.int64)
    table: IntArray = unit[:, None].astype(np.int64) * per_node[None, :]
    table[p.limit == 0] = 0
    return table


def _domain_levels(
    p: GangProblem, snapshot: Snapshot, index: IndexArray, keys: Sequence[str]
) -> list[Level]:
    """The levels of ``keys`` over the local nodes, less any whose every domain is one
    node (the node level: the GPUs-kept tier ranks nodes)."""
    out = [node_level(snapshot, key, index) for key in keys]
    return [level for level in out if level.size < p.num_nodes]


def empty_domains(
    p: GangProblem,
    snapshot: Snapshot,
    index: IndexArray,
    finer: Sequence[Level],
    gpu_resource: str,
) -> tuple[EmptyDomains, ...]:
    """See :attr:`GangProblem.empty`: GPU gangs only; a domain is empty when no node of it
    in the snapshot (those the gang cannot use too) has a GPU in use."""
    if not p.num_nodes or not bool((p.gpus > 0).any()):
        return ()
    gcol = snapshot.resource_column(gpu_resource)
    if gcol is None:
        return ()
    out = []
    everyone = np.arange(len(snapshot.node_names), dtype=np.intp)
    alloc = snapshot.allocatable[gcol].astype(np.int64)
    busy = (alloc > 0) & (snapshot.requested[gcol] > 0)
    for level in finer:
        ids = _domain_ids(snapshot, level.key, everyone)
        values_busy = np.unique(ids[(ids >= 0) & busy])
        local_ids = _domain_ids(snapshot, level.key, index)
        room = np.zeros(level.size, dtype=np.int64)
        labelled = local_ids >= 0
        whole = labelled & ~np.isin(local_ids, values_busy)
        np.add.at(room, level.domain[whole], np.maximum(p.gpu_free[whole], 0))
        if room.any():
            out.append(EmptyDomains(level, room))
    return tuple(out)


def _pack_bound(pack: IntArray, p: GangProblem) -> int:
    """The pack tier's largest value: every member of a class at its best node."""
    if not pack.size:
        return 0
    return sum(int(pack[c].max(initial=0)) * k.size for c, k in enumerate(p.classes))


def _with_slices(
    problem: GangProblem,
    snapshot: Snapshot,
    gang: GangSpec,
    levels: Sequence[str],
    bound: Sequence[tuple[str, int]],
) -> GangProblem:
    """The slice level's domains and the bound members in each; nodes without its label
    hold no member (a slice must be inside a domain). A slice level that is not a
    configured level (the levels changed since the PodGroup was read) rejects the gang."""
    p = problem
    key, size = gang.slice_key, gang.slice_size
    assert key is not None
    assert size is not None
    if key not in levels:
        return dataclasses.replace(
            p, rejection=f"slice level {key} is not one of spec.topology.levels"
        )
    index = np.array([snapshot.index_of(n) for n in p.node_names], dtype=np.intp)
    ids = _domain_ids(snapshot, key, index) if len(index) else np.zeros(0, np.int64)
    labelled = ids >= 0
    values, dense = np.unique(ids[labelled], return_inverse=True)
    domain = np.full(len(ids), -1, dtype=np.int64)
    domain[labelled] = dense.reshape(-1)
    column = snapshot.label_column(key)
    names = tuple(column.values[int(v)] for v in values.tolist()) if column is not None else ()
    limit = p.limit.copy()
    limit[:, ~labelled] = 0
    where = {name: d for d, name in enumerate(names)}
    members: dict[tuple[str, int], int] = {}
    for value, k in bound:
        members[(value, k)] = members.get((value, k), 0) + 1
    short = np.zeros(len(names), dtype=np.int64)
    for (value, k), count in sorted(members.items()):
        if count % size == 0:
            continue
        if value not in where:  # none of its domain's nodes can take a member now
            more = size - count % size
            return dataclasses.replace(
                p,
                rejection=f"slice {k} is short of {more} member{'s' if more != 1 else ''} "
                f"in {key}={value}, where no node can take one now",
            )
        short[where[value]] += size - count % size
    known = tuple((where[v], k) for v, k in bound if v in where)
    capacity = p.capacity if len(p.capacity) == p.num_nodes else member_capacity(p)
    capacity = np.where(labelled, capacity, 0)
    return dataclasses.replace(
        p,
        limit=limit,
        capacity=capacity,
        slice_size=size,
        slicing=Level(key, domain, names),
        slice_short=short,
        slice_bound=known,
    )


def counted_nominations(
    snapshot: Snapshot, members: Sequence[Pod], nominated: Sequence[tuple[Pod, str]]
) -> list[tuple[Pod, str]]:
    """The nominations a gang's solve counts: priority >= its lowest member's, not a
    member's own, not placed already, on a node of the snapshot."""
    if not nominated or not members:
        return []
    lowest = min(members, key=lambda m: m.priority)
    own = {m.key for m in members}
    by_node = nominated_by_node(snapshot, lowest, nominated)
    return [(pod, node) for node, pods in by_node.items() for pod in pods if pod.key not in own]


def _feasible_mask(decision: Decision) -> BoolArray:
    explanation = decision.explanation
    mask = np.zeros(explanation.num_nodes, dtype=np.bool_)
    mask[explanation.feasible_rows] = True
    return mask


def _class_decisions(
    framework: Framework,
    snapshot: Snapshot,
    members: Sequence[Pod],
    merge: bool,
    topology: TopologyState | None,
    load: LoadView | None,
    seed: int,
    volumes: VolumeState | None,
    dra: DraState | None,
) -> tuple[list[list[int]], list[Pod], dict[int, _Follow], list[Decision]]:
    """The member classes, their representatives, the followers among them and one
    framework decision per class. A follower runs the framework without its required
    affinity: the model adds it back (one domain with an anchor); every other filter and
    every score still applies."""
    groups = _classes(snapshot, members, dra) if merge else [[i] for i in range(len(members))]
    reps = [members[g[0]] for g in groups]
    follows = _follows(snapshot, reps)
    decisions = [
        framework.schedule(
            snapshot,
            dataclasses.replace(rep, required_affinity=()) if c in follows else rep,
            seed=seed,
            topology=topology,
            load=load,
            volumes=volumes,
            dra=dra,
        )
        for c, rep in enumerate(reps)
    ]
    return groups, reps, follows, decisions


def _build(
    framework: Framework,
    snapshot: Snapshot,
    gang: GangSpec,
    members: Sequence[Pod],
    need: int,
    topology: TopologyState | None,
    load: LoadView | None,
    seed: int,
    merge: bool,
    volumes: VolumeState | None,
    passes_without: Sequence[BoolArray] | None,
    dra: DraState | None = None,
) -> GangProblem:
    """:func:`build_problem` on the snapshot as it is; ``passes_without``: per class, the
    rows it passes without the counted nominations (a feasible row must pass both)."""
    started = time.perf_counter()
    names = tuple(f"{m.namespace}/{m.name}" for m in members)
    shortfall = _min_resources_shortfall(snapshot, gang.min_resources)
    if shortfall is not None:
        keys = tuple(m.key for m in members)
        return _rejected(gang, need, names, keys, shortfall, time.perf_counter() - started)

    groups, reps, follows, decisions = _class_decisions(
        framework, snapshot, members, merge, topology, load, seed, volumes, dra
    )
    feasible_rows = [d.explanation.feasible_rows.astype(np.intp) for d in decisions]
    if passes_without is not None:
        feasible_rows = [rows[passes_without[c][rows]] for c, rows in enumerate(feasible_rows)]
    union: IndexArray = (
        np.unique(np.concatenate(feasible_rows)).astype(np.intp)
        if any(len(r) for r in feasible_rows)
        else np.zeros(0, dtype=np.intp)
    )
    k, c_count = len(union), len(groups)
    node_names = tuple(snapshot.node_names[i] for i in union.tolist())

    resources = _model_resources(framework, reps)
    request = np.array(
        [[rep.resources.requests.get(r, 0) for r in resources] for rep in reps], dtype=np.int64
    ).reshape(c_count, len(resources))
    free = np.zeros((len(resources), k), dtype=np.int64)
    for j, r in enumerate(resources):
        col = snapshot.resource_column(r)
        if col is not None:
            free[j] = snapshot.allocatable[col][union] - snapshot.requested[col][union]
    _serve_by_dra(framework, snapshot, dra, resources, request, groups, union, free)
    free_pods = snapshot.allowed_pods[union] - snapshot.pod_counts[union]

    limit = np.zeros((c_count, k), dtype=np.int64)
    score = np.zeros((c_count, k), dtype=np.int64)
    preferred = np.zeros((c_count, k), dtype=np.bool_)
    classes: list[MemberClass] = []
    for c, (group, rep, decision) in enumerate(zip(groups, reps, decisions, strict=True)):
        rows = feasible_rows[c]
        local = np.searchsorted(union, rows)
        explanation = decision.explanation
        bound = np.full(len(rows), len(group), dtype=np.int64)
        for j in range(len(resources)):
            if request[c, j] > 0:
                bound = np.minimum(bound, np.maximum(free[j, local], 0) // request[c, j])
        bound = np.minimum(bound, np.maximum(free_pods[local], 0))
        if rep.host_ports:
            bound = np.minimum(bound, 1)
        caps, active, aligned = _topology_caps(framework, snapshot, topology, rep, rows, len(group))
        claim_caps, claiming = _claim_caps(framework, snapshot, dra, rep, rows, len(group))
        # A class that allocates DRA devices counts as a device user (aligned: another
        # class's claims could take its devices): the same one-class-per-node rule.
        active, aligned = active or claiming, aligned or claiming
        limit[c, local] = np.minimum(bound, np.minimum(caps, claim_caps))
        score[c, local] = explanation.totals[rows]
        passed = np.zeros(snapshot.num_nodes, dtype=np.bool_)
        for record in explanation.preferences:
            if record.applied:
                passed |= record.preference.passed_over
        preferred[c, local] = ~passed[rows]
        classes.append(
            MemberClass(
                members=tuple(group),
                summary=explanation.summary,
                rejecting_plugins=tuple(sorted(explanation.rejecting_plugins)),
                feasible_nodes=len(rows),
                host_ports=bool(rep.host_ports),
                topology_active=active,
                aligned=aligned,
            )
        )

    anti = _anti_affinity(snapshot, reps, groups, union)
    together = _together(snapshot, reps, groups, union, follows)
    limit[outside_groups(together, c_count, k)] = 0  # bounds and sub-models see it too
    spreads = _spreads(snapshot, reps, union, topology, load)
    port_conflicts = _port_conflicts(reps)

    domain = np.full(k, -1, dtype=np.int64)
    domain_names: tuple[str, ...] = ()
    if gang.topology_key:
        domain = _domain_ids(snapshot, gang.topology_key, union)
        column = snapshot.label_column(gang.topology_key)
        domain_names = tuple(column.values) if column is not None else ()
        limit[:, domain < 0] = 0  # nodes without the label are out
    device_exclusive = _device_exclusive(classes, limit)

    gpu_resource = framework.profile.topology.gpu_resource
    gpus = np.array([rep.resources.requests.get(gpu_resource, 0) for rep in reps], dtype=np.int64)
    gpu_alloc = np.zeros(k, dtype=np.int64)
    gpu_free = np.zeros(k, dtype=np.int64)
    gcol = snapshot.resource_column(gpu_resource)
    if gcol is not None:
        gpu_alloc = snapshot.allocatable[gcol][union].astype(np.int64)
        gpu_free = gpu_alloc - snapshot.requested[gcol][union]
    gpu_users = (limit > 0) & (gpus[:, None] > 0)
    frag_nodes = (gpu_alloc > 0) & gpu_users.any(axis=0)
    mix = (topology.gpu_demand if topology is not None else GpuDemand()).classes()
    keep = keep_table(gpu_free, frag_nodes, mix)

    member_class = [0] * len(members)
    for c, group in enumerate(groups):
        for i in group:
            member_class[i] = c
    weights = _weights(members_best(score, limit, groups), len(members), keep, preferred, limit)
    reports = tuple(
        MemberReport(
            index=i,
            pod=names[i],
            key=members[i].key,
            member_class=member_class[i],
            feasible_nodes=classes[member_class[i]].feasible_nodes,
            rejecting_plugins=classes[member_class[i]].rejecting_plugins,
            summary=classes[member_class[i]].summary,
        )
        for i in range(len(members))
    )
    return GangProblem(
        gang=gang.key,
        need=need,
        members=names,
        member_class=tuple(member_class),
        classes=tuple(classes),
        node_names=node_names,
        resources=resources,
        request=request,
        free=free,
        free_pods=free_pods.astype(np.int64),
        limit=limit,
        score=score,
        preferred=preferred,
        gpus=gpus,
        gpu_alloc=gpu_alloc,
        gpu_free=gpu_free,
        frag_nodes=frag_nodes,
        keep=keep,
        topology_key=gang.topology_key or None,
        domain=domain,
        domain_names=domain_names,
        anti=anti,
        together=together,
        spreads=spreads,
        port_conflicts=port_conflicts,
        device_exclusive=device_exclusive,
        weights=weights,
        reports=reports,
        build_time_s=time.perf_counter() - started,
        rank=tuple(follows[c].rank if c in follows else 0 for c in range(c_count)),
    )


# ----------------------------------------------------------------- pre-check
def _min_resources_shortfall(snapshot: Snapshot, wanted: Mapping[str, int]) -> str | None:
    """Why the cluster's total free capacity cannot cover ``minResources``, or None."""
    short: list[str] = []
    for resource, amount in sorted(wanted.items()):
        if amount <= 0:
            continue
        if resource == PODS:
            available = int(np.maximum(snapshot.allowed_pods - snapshot.pod_counts, 0).sum())
        else:
            col = snapshot.resource_column(resource)
            available = (
                0
                if col is None
                else int(np.maximum(snapshot.allocatable[col] - snapshot.requested[col], 0).sum())
            )
        if available < amount:
            short.append(f"{resource} {amount} wanted, {available} free")
    if not short:
        return None
    return "minResources exceed the cluster's free capacity: " + ", ".join(short)


def _rejected(
    gang: GangSpec,
    need: int,
    names: tuple[str, ...],
    keys: tuple[str, ...],
    why: str,
    elapsed: float,
) -> GangProblem:
    empty = np.zeros(0, dtype=np.int64)
    reports = tuple(
        MemberReport(i, name, key, 0, 0, (), f"not evaluated: {why}")
        for i, (name, key) in enumerate(zip(names, keys, strict=True))
    )
    return GangProblem(
        gang=gang.key,
        need=need,
        members=names,
        member_class=(0,) * len(names),
        classes=(),
        node_names=(),
        resources=(),
        request=np.zeros((0, 0), dtype=np.int64),
        free=np.zeros((0, 0), dtype=np.int64),
        free_pods=empty,
        limit=np.zeros((0, 0), dtype=np.int64),
        score=np.zeros((0, 0), dtype=np.int64),
        preferred=np.zeros((0, 0), dtype=np.bool_),
        gpus=empty,
        gpu_alloc=empty,
        gpu_free=empty,
        frag_nodes=np.zeros(0, dtype=np.bool_),
        keep=np.zeros((0, 1), dtype=np.int64),
        topology_key=gang.topology_key or None,
        domain=empty,
        domain_names=(),
        anti=(),
        together=(),
        spreads=(),
        port_conflicts=np.zeros((0, 0), dtype=np.bool_),
        device_exclusive=np.zeros(0, dtype=np.bool_),
        weights=Weights(1, 1, 1),
        reports=reports,
        rejection=why,
        build_time_s=elapsed,
    )


# ------------------------------------------------------------- member classes
def _selector_keys(selector: LabelSelector) -> set[str]:
    return {r.key for r in selector.requirements}


def _term_keys(pod: Pod) -> set[str]:
    keys: set[str] = set()
    terms: list[PodAffinityTerm] = [*pod.required_affinity, *pod.required_anti_affinity]
    terms += [w.term for w in (*pod.preferred_affinity, *pod.preferred_anti_affinity)]
    for term in terms:
        keys |= _selector_keys(term.selector)
    return keys


def referenced_label_keys(snapshot: Snapshot, members: Iterable[Pod]) -> frozenset[str]:
    """Pod label keys some selector could read while placing these members.

    An incoming pod's labels are read by its own spread constraints and affinity terms
    (self-match), by placed pods' affinity terms (existing anti-affinity, scoring), and by
    the members' terms selecting each other in the model. Nothing else reads them.
    """
    keys: set[str] = set()
    for pod in members:
        keys |= _term_keys(pod)
        for constraint in pod.spread_constraints:
            keys |= _selector_keys(constraint.selector)
    for pod, _ in snapshot.pods_with_affinity():
        keys |= _term_keys(pod)
    return frozenset(keys)


def member_signature(pod: Pod, label_keys: frozenset[str], dra: DraState | None = None) -> Pod:
    """The pod as the framework and the model see it: no name or uid, only readable labels
    and annotations, and its own unallocated template claims by what they request (each
    member has a claim of its own name from one template; the allocator reads only the
    spec). Equal signatures mean identical decisions and identical model rows."""
    generated, refs = pod.generated_claims, pod.resource_claims
    if dra is not None and refs:
        generated = {
            ref: _claim_spec(pod, name, dra, owned=True) if name is not None else None
            for ref, name in sorted(generated.items())
        }
        refs = tuple(
            dataclasses.replace(r, claim_name=_claim_spec(pod, r.claim_name, dra, owned=False))
            if r.claim_name
            else r
            for r in refs
        )
    return dataclasses.replace(
        pod,
        name="",
        uid="",
        labels={k: v for k, v in sorted(pod.labels.items()) if k in label_keys},
        annotations={
            k: v for k, v in sorted(pod.annotations.items()) if k.startswith(READ_ANNOTATION_PREFIX)
        },
        generated_claims=generated,
        resource_claims=refs,
    )


def _claim_spec(pod: Pod, name: str, dra: DraState, *, owned: bool) -> str:
    """A claim as the allocator sees it (its spec) while it is unallocated, unreserved and,
    from a template (``owned``), the pod's own; otherwise its name, which then differs per
    member, and so do the classes. (A gang whose members share an unallocated claim is
    refused before its problem is built.)"""
    claim = dra.claims.get((pod.namespace, name))
    if (
        claim is None
        or claim.allocation is not None
        or claim.reserved_for
        or (owned and claim.controller_uid != pod.uid)
        or dra.pending_for(claim.key) is not None
    ):
        return name
    return f"spec:{(claim.requests, claim.constraints, claim.config)!r}"


def _classes(snapshot: Snapshot, members: Sequence[Pod], dra: DraState | None) -> list[list[int]]:
    keys = referenced_label_keys(snapshot, members)
    signatures: list[Pod] = []
    groups: list[list[int]] = []
    for i, pod in enumerate(members):
        signature = member_signature(pod, keys, dra)
        for c, other in enumerate(signatures):
            if other == signature:
                groups[c].append(i)
                break
        else:
            signatures.append(signature)
            groups.append([i])
    return groups


def _model_resources(framework: Framework, reps: Sequence[Pod]) -> tuple[str, ...]:
    """Resources some class requests and NodeResourcesFit checks, cpu/memory first."""
    args = framework.profile.node_resources_fit

    def ignored(resource: str) -> bool:
        if not is_extended_resource(resource):
            return False
        group = resource.split("/", 1)[0]
        return resource in args.ignored_resources or group in args.ignored_resource_groups

    wanted = {r for rep in reps for r, amount in rep.resources.requests.items() if amount > 0} - {
        PODS
    }
    return tuple(sorted((r for r in wanted if not ignored(r)), key=lambda r: (r != CPU, r)))


def members_best(score: IntArray, limit: IntArray, groups: Sequence[Sequence[int]]) -> int:
    """Sum over members of their best feasible score: the bound of the score tier."""
    total = 0
    for c, group in enumerate(groups):
        feasible = limit[c] > 0
        if feasible.any():
            total += int(score[c][feasible].max()) * len(group)
    return total


def keep_table(gpu_free: IntArray, frag_nodes: BoolArray, mix: Sequence[SizeClass]) -> IntArray:
    """Per local node and GPUs used there (0..most free), the GPUs kept usable by the mix:
    ``max over uses - fragmentation after``, in thousandths of a GPU. By count only (the
    gang's cpu per node depends on the plan); uses beyond the node's free GPUs repeat the
    last value (the capacity rule forbids them anyway)."""
    free = np.maximum(gpu_free, 0)
    width = int(free[frag_nodes].max()) + 1 if frag_nodes.any() else 1
    used = np.arange(width, dtype=np.int64)
    left = np.maximum(free[:, None] - used[None, :], 0)
    flat = left.reshape(-1)
    unbounded = np.full(len(flat), np.iinfo(np.int64).max // 4, dtype=np.int64)
    after = Free(flat, unbounded, unbounded, flat)
    frag = np.rint(fragmentation(after, mix) * 1000).astype(np.int64).reshape(left.shape)
    keep: IntArray = frag.max(axis=1, keepdims=True) - frag
    keep[~frag_nodes] = 0
    return keep


def _keep_range(keep: IntArray, members: int) -> int:
    """How far the GPUs-kept tier can differ between two placements: only the nodes one of
    them uses (at most ``2 * members``) differ, each by at most its own range. Bounding by
    that rather than the whole table keeps large clusters' objectives within CP-SAT's
    int64 (one unit of the score tier must outweigh it, no more)."""
    if not keep.size:
        return 0
    spread = np.sort(keep.max(axis=1) - keep.min(axis=1))[::-1]
    return int(spread[: 2 * max(members, 1)].sum())


def _weights(
    best_score: int,
    members: int,
    keep: IntArray,
    preferred: BoolArray,
    limit: IntArray,
    *,
    spans: Sequence[int] = (),
    tight: int = 0,
    pack: int = 0,
    whole_domains: int = 0,
) -> Weights:
    """Tier weights: each tier's largest possible value stays below the next tier's unit.

    From the top: placed members; domains left unused at the preferred level
    (``spans[-1]``), then at each wider level from the widest (``spans[0]``) down; the
    tight ranks left unused; empty domains below the tight level kept whole; members in
    fuller domains there (``pack``); members on preferred nodes; score; GPUs kept usable.
    The network tiers outrank the node scores: a gang's racks matter more to it than the
    nodes' least-allocated order."""
    score = _keep_range(keep, members) + 1
    above = score * (best_score + 1)
    preferred_w = 0
    if bool(((limit > 0) & ~preferred).any()):
        preferred_w, above = above, above * (members + 1)
    pack_w = whole_w = 0
    if pack:
        pack_w, above = above, above * (pack + 1)
    if whole_domains:
        whole_w, above = above, above * (whole_domains + 1)
    tight_w = 0
    if tight:
        tight_w, above = above, above * (tight + 1)
    span_w = [0] * len(spans)
    for i in [*range(len(spans) - 2, -1, -1), len(spans) - 1][: len(spans)]:
        span_w[i], above = above, above * (spans[i] + 1)
    return Weights(
        placed=above,
        preferred=preferred_w,
        score=score,
        spans=tuple(span_w),
        tight=tight_w,
        pack=pack_w,
        whole_domains=whole_w,
    )


# ------------------------------------------------------------------ topology
def _topology_caps(
    framework: Framework,
    snapshot: Snapshot,
    topology: TopologyState | None,
    pod: Pod,
    rows: IndexArray,
    size: int,
) -> tuple[IntArray, bool, bool]:
    """Per feasible row, how many such members Topology aligns one after another.

    Returns (caps, active, aligned). The simulation uses the plugin's own placement on the
    node's free devices, adding each chosen member's devices as a holding, exactly what
    assuming members one by one would do.
    """
    caps = np.full(len(rows), UNLIMITED, dtype=np.int64)
    plugin = next((p for p in framework.plugins.filters if isinstance(p, Topology)), None)
    if plugin is None or topology is None or not topology.has_topology():
        return caps, False, False
    try:
        request = TopologyRequest.from_pod(pod, plugin.args)
    except InvalidTopologyRequest:
        return caps, False, False
    pins = request.cpus > 0 and topology.pins_cpus_anywhere()
    if not request.wants_devices and not pins:
        return caps, False, False
    aligned = request.alignment is not GpuAlignment.PREFERRED or pins
    exclusive_nics = 0 if request.shared_nic else request.nics
    cpu_col = snapshot.resource_column(CPU)
    memo: dict[tuple[object, ...], tuple[int, bool]] = {}
    names = snapshot.node_names
    for i, row in enumerate(rows.tolist()):
        name = names[row]
        layout, serial = topology.layout(name), topology.serial(name)
        if layout is None or serial is None:
            continue
        cpus = int(snapshot.allocatable[cpu_col][row] // 1000) if cpu_col is not None else None
        held = [h for _, h in topology.ledger.holdings(name)]
        key = (serial, cpus, tuple((h.assignment, h.gpus, h.nics, h.cpus) for h in held))
        if key not in memo:
            count, rejected = 0, False
            free = topology.free(name, cpus)
            simulated: list[Holding] = []
            while free is not None and count < size:
                outcome = plugin.place(topology, name, layout, request, free)
                if isinstance(outcome, Placement):
                    count += 1
                    held_now = Holding(
                        name, outcome.assignment(), request.gpus, exclusive_nics, request.cpus
                    )
                    simulated.append(held_now)
                    free = free_state(layout, [*held, *simulated], cpus)
                elif outcome is None:
                    count = UNLIMITED  # passes without a placement: counts decide
                    break
                else:
                    rejected = True
                    break
            memo[key] = (count if rejected else UNLIMITED, rejected)
        cap, rejected = memo[key]
        caps[i] = cap
        aligned = aligned or rejected
    return caps, True, aligned


def _serve_by_dra(
    framework: Framework,
    snapshot: Snapshot,
    dra: DraState | None,
    resources: Sequence[str],
    request: IntArray,
    groups: Sequence[Sequence[int]],
    union: IndexArray,
    free: IntArray,
) -> None:
    """An extended resource a DeviceClass serves is not counted where a node's allocatable
    lacks it (NodeResourcesFit skips it there, kube's ``shouldDelegateResourceToDRA``): its
    free amount becomes the gang's whole demand, and the node's devices bound the members
    instead (:func:`_claim_caps`, with the claim DynamicResources makes for them)."""
    plugin = _dra_plugin(framework)
    if dra is None or plugin is None or plugin.kube_minor < DRA_EXTENDED_SINCE:
        return
    sizes = np.array([len(g) for g in groups], dtype=np.int64)
    for j, r in enumerate(resources):
        if not is_dra_extended_resource(r) or dra.extended_class(r) is None:
            continue
        col = snapshot.resource_column(r)
        lacking = (
            np.ones(len(union), dtype=np.bool_)
            if col is None
            else snapshot.allocatable[col][union] <= 0
        )
        free[j, lacking] = int(request[:, j] @ sizes)


def _dra_plugin(framework: Framework) -> DynamicResources | None:
    return next((p for p in framework.plugins.filters if isinstance(p, DynamicResources)), None)


def _claim_caps(
    framework: Framework,
    snapshot: Snapshot,
    dra: DraState | None,
    pod: Pod,
    rows: IndexArray,
    size: int,
) -> tuple[IntArray, bool]:
    """Per feasible row, how many members with ``pod``'s claims (and the claim made for its
    extended resources where the node serves them by DRA) the node's free devices take one
    after another, with the allocator DynamicResources uses and each simulated
    member's devices counted as used: what the commit's member-by-member allocation does.
    Returns (caps, claiming: the class allocates devices).

    The search over all rows shares the DRA budget of one attempt
    (:mod:`scheduler.core.dra.search`), since it runs on the event loop: once spent, a row
    keeps what was counted, at least 1 (each row passed the member's filter, so one
    member's claims fit there), and the rows after it get 1."""
    caps = np.full(len(rows), UNLIMITED, dtype=np.int64)
    if dra is None:
        return caps, False
    plugin = _dra_plugin(framework)
    minor = plugin.kube_minor if plugin is not None else DEFAULT_KUBE_MINOR
    extra = extended_claims(pod, dra, snapshot, minor)
    claims = (unallocated_claims(pod, dra) or []) if pod.resource_claims else []
    if not claims and extra is None:
        return caps, False  # allocated claims: their nodeSelector is the filter's
    base = dra.allocated_devices()
    index = dra.slice_index()
    aligned = plugin.aligned if plugin is not None else False
    compact = plugin.compact_config if plugin is not None else True
    budget = min(plugin.args.search_budget if plugin is not None else SEARCH_BUDGET, ON_LOOP_BUDGET)
    stop_at = time.monotonic() + budget
    spent = False
    claiming = bool(claims)
    for i, row in enumerate(rows.tolist()):
        own = extra.at(row) if extra is not None else None
        wanted = claims if own is None else [*claims, own]
        if not wanted:
            continue  # its allocatable serves the extended resources: NodeResourcesFit's
        claiming = True
        if spent:
            caps[i] = 1
            continue
        node = snapshot.node(row)
        used: set[DeviceId] = set(base)
        count = 0
        while count < size:
            allocator = Allocator(
                classes=dra.classes,
                slices=index,
                allocated=used,
                compiler=dra.compiler,
                aligned=aligned,
                compact_config=compact,
                kube_minor=minor,
                shared=dra.shared_capacity(),
            )
            try:
                found = allocator.allocate(node.name, node.labels, wanted, stop_at=stop_at)
            except (AllocationError, NodeAllocationError):
                break
            except BudgetExhausted:
                spent = True
                count = max(count, 1)
                break
            if found is None:
                break
            count += 1
            for allocation in found:
                for r in allocation["devices"]["results"]:
                    if r.get("adminAccess") is not True:
                        used.add(DeviceId(r["driver"], r["pool"], r["device"]))
        caps[i] = count
    return caps, claiming


def _device_exclusive(classes: Sequence[MemberClass], limit: IntArray) -> BoolArray:
    """Nodes where two Topology-using classes could meet and one of them needs alignment."""
    k = limit.shape[1]
    active = np.array([c.topology_active for c in classes], dtype=np.bool_)
    aligned = np.array([c.aligned for c in classes], dtype=np.bool_)
    if not active.any():
        return np.zeros(k, dtype=np.bool_)
    users = (limit > 0) & active[:, None]
    out: BoolArray = (users.sum(axis=0) >= 2) & (users & aligned[:, None]).any(axis=0)
    return out


# ------------------------------------------------------------- joint rules
def _domain_ids(snapshot: Snapshot, key: str, union: IndexArray) -> IntArray:
    column = snapshot.label_column(key)
    if column is None:
        return np.full(len(union), -1, dtype=np.int64)
    return column.ids[union].astype(np.int64)


def _anti_affinity(
    snapshot: Snapshot, reps: Sequence[Pod], groups: Sequence[Sequence[int]], union: IndexArray
) -> tuple[AntiAffinity, ...]:
    out: list[AntiAffinity] = []
    for c, rep in enumerate(reps):
        for term in rep.required_anti_affinity:
            matched = tuple(
                m for m, other in enumerate(reps) if incoming_term_matches(term, other, snapshot)
            )
            if not matched or (matched == (c,) and len(groups[c]) == 1):
                continue  # selects no other member
            domain = _domain_ids(snapshot, term.topology_key, union)
            out.append(AntiAffinity(c, matched, term.topology_key, domain))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class _Follow:
    matched: tuple[int, ...]
    """Other classes matching every required affinity term of the follower."""
    anchors: tuple[int, ...]
    """The matched classes of lower rank: one of them must be placed first."""
    rank: int


def _follows(snapshot: Snapshot, reps: Sequence[Pod]) -> dict[int, _Follow]:
    """Classes whose required affinity selects other member classes but not themselves,
    with no placed pod matching yet: kube's filter rejects them everywhere until a matching
    pod is placed, which a member of the gang can be. Ranks make the anchoring acyclic (a
    class anchors only on classes of lower rank); classes that only select each other, with
    nothing else to start from, are left to the framework's rejection, as kube leaves them.
    """
    candidates: dict[int, tuple[int, ...]] = {}
    for c, rep in enumerate(reps):
        if not rep.required_affinity:
            continue
        state = required_state(snapshot.affinity_graph, rep)
        if state.affinity_counts or state.pod_matches_own_affinity:
            continue  # anchored by placed pods, or starts its own group (_together)
        matched = tuple(
            m
            for m, other in enumerate(reps)
            if m != c
            and all(incoming_term_matches(t, other, snapshot) for t in rep.required_affinity)
        )
        if matched:
            candidates[c] = matched
    rank = {c: 0 for c in range(len(reps)) if c not in candidates}
    changed = True
    while changed:
        changed = False
        for c, matched in candidates.items():
            known = [rank[m] for m in matched if m in rank]
            if c not in rank and known:
                rank[c] = 1 + min(known)
                changed = True
    return {
        c: _Follow(matched, tuple(m for m in matched if m in rank and rank[m] < rank[c]), rank[c])
        for c, matched in candidates.items()
        if c in rank
    }


def _together(
    snapshot: Snapshot,
    reps: Sequence[Pod],
    groups: Sequence[Sequence[int]],
    union: IndexArray,
    follows: Mapping[int, _Follow],
) -> tuple[Together, ...]:
    """Required affinity of members that start their group (no placed pod matches yet).

    The framework lets such a member go anywhere; jointly, a member needs another matching
    pod in its domain. Keeping every matching member in one domain per key is sufficient
    (stricter than needed when they could form several groups). A follower (see
    :func:`_follows`) shares one domain per key with every member it selects, and needs an
    anchor placed.
    """
    out: list[Together] = []
    for c, rep in enumerate(reps):
        if not rep.required_affinity:
            continue
        keys = sorted({t.topology_key for t in rep.required_affinity})
        follow = follows.get(c)
        if follow is not None:
            classes = tuple(sorted({c, *follow.matched}))
            for key in keys:
                domain = _domain_ids(snapshot, key, union)
                out.append(Together(classes, key, domain, follower=c, anchors=follow.anchors))
            continue
        state = required_state(snapshot.affinity_graph, rep)
        if state.affinity_counts or not state.pod_matches_own_affinity:
            continue  # anchored by placed pods, or rejected everywhere by the framework
        matched = tuple(
            m
            for m, other in enumerate(reps)
            if all(incoming_term_matches(t, other, snapshot) for t in rep.required_affinity)
        )
        if sum(len(groups[m]) for m in matched) <= 1:
            continue
        for key in keys:
            out.append(Together(matched, key, _domain_ids(snapshot, key, union)))
    return tuple(out)


def class_ranks(problem: GangProblem) -> IntArray:
    """Per class, its commit rank (:attr:`GangProblem.rank`; 0 when none is recorded)."""
    if len(problem.rank) == problem.num_classes:
        return np.array(problem.rank, dtype=np.int64)
    return np.zeros(problem.num_classes, dtype=np.int64)


def outside_groups(together: Sequence[Together], classes: int, nodes: int) -> BoolArray:
    """(classes, local nodes) cells an affinity group closes: its classes on nodes without
    its key. One rule for build_problem, CP-SAT and the naive model (greedy and
    :func:`~scheduler.solver.check.violations` state it again, independently)."""
    out = np.zeros((classes, nodes), dtype=np.bool_)
    for rule in together:
        out[list(rule.classes)] |= (rule.domain < 0)[None, :]
    return out


def _spreads(
    snapshot: Snapshot,
    reps: Sequence[Pod],
    union: IndexArray,
    topology: TopologyState | None,
    load: LoadView | None,
) -> tuple[Spread, ...]:
    out: list[Spread] = []
    for c, rep in enumerate(reps):
        hard = [
            s
            for s in rep.spread_constraints
            if s.when_unsatisfiable is UnsatisfiableAction.DO_NOT_SCHEDULE
        ]
        if not hard:
            continue
        cycle = Cycle(snapshot, rep, topology=topology, load=load)
        has_all = np.ones(snapshot.num_nodes, dtype=np.bool_)
        for s in hard:
            has_all &= snapshot.has_label_mask(s.topology_key)
        for s in hard:
            if s.selector.is_empty:
                continue  # an empty selector counts no pod at all
            matched = tuple(
                m
                for m, other in enumerate(reps)
                if other.namespace == rep.namespace and s.selector.matches(other.labels)
            )
            if not matched:
                continue
            ids, size = spread_plugin.value_ids(cycle, s.topology_key)
            included = spread_plugin.included_nodes(cycle, s, has_all)
            per_value = spread_plugin.counts_by_value_id(cycle, s, included, ids, size)
            present = np.zeros(size + 1, dtype=np.bool_)
            present[ids[included]] = True
            local_ids = ids[union].astype(np.int64)
            local_ids[local_ids >= size] = -1
            out.append(
                Spread(
                    cls=c,
                    matched=matched,
                    key=s.topology_key,
                    max_skew=s.max_skew,
                    domain=local_ids,
                    counted=included[union] & (local_ids >= 0),
                    existing=per_value[:size].astype(np.int64),
                    eligible=present[:size],
                    min_zero=int(present[:size].sum()) < s.min_domains,
                )
            )
    return tuple(out)


def _port_conflicts(reps: Sequence[Pod]) -> BoolArray:
    n = len(reps)
    out = np.zeros((n, n), dtype=np.bool_)
    for a in range(n):
        if not reps[a].host_ports:
            continue
        for b in range(n):
            used_b = set(reps[b].host_ports)
            used_a = set(reps[a].host_ports)
            if any(conflicts(p, used_b) for p in reps[a].host_ports) or any(
                conflicts(p, used_a) for p in reps[b].host_ports
            ):
                out[a, b] = out[b, a] = True
    return out


__all__ = [
    "UNLIMITED",
    "AntiAffinity",
    "GangProblem",
    "Level",
    "MemberClass",
    "MemberReport",
    "Spread",
    "Together",
    "Weights",
    "build_problem",
    "class_ranks",
    "compact_keys",
    "counted_nominations",
    "member_signature",
    "outside_groups",
    "referenced_label_keys",
]

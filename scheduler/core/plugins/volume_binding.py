"""VolumeBinding: a pod's claims decide its node together with their volumes (kube 1.35-1.37).

PreFilter reads every claim of the pod (``persistentVolumeClaim`` and generic ephemeral
volumes) from the VolumeState and rejects the pod as UnschedulableAndUnresolvable when one
is missing, lost, being deleted, not the pod's own (ephemeral), or unbound with Immediate
binding (the PV controller, not the scheduler, binds those). The rest are *bound* (a volume
name and ``pv.kubernetes.io/bind-completed``) or *delayed* (WaitForFirstConsumer, no volume
name yet). kube returns no node set from PreFilter, so neither do we.

Filter, per node (vectorised over nodes, one pass per claim and PV):

* bound claims: the PV must exist ("... bound to non-existent pv(s)") and its required node
  affinity must match the node's labels ("didn't match PersistentVolume's node affinity");
  claims are checked in order and the first failure decides, as ``checkBoundClaims`` does;
* delayed claims: a claim already carrying ``volume.kubernetes.io/selected-node`` fits only
  that node; the others, smallest request first, each take the smallest available PV of
  their class that fits (capacity, volume mode, attributes class, selector, access modes,
  node affinity, not taken by an earlier claim on that node) — a PV pre-bound to the claim
  wins outright;
* claims to provision (the selected-node ones, then those left without a PV), in that
  order, the first failure deciding (``checkVolumeProvisions``): a StorageClass whose
  provisioner can provision (not ``kubernetes.io/no-provisioner``) within its
  ``allowedTopologies``, else "didn't find available persistent volumes to bind"; then, if
  the claim requests storage and its provisioner's CSIDriver has ``storageCapacity: true``,
  a CSIStorageCapacity of the claim's class whose ``maximumVolumeSize`` (else
  ``capacity``) holds the request and whose ``nodeTopology`` selects the node, else "did
  not have enough free storage" (``hasEnoughCapacity``).

All rejections are UnschedulableAndUnresolvable, like kube's.

Score, from 1.37 only (StorageCapacityScoring, KEP-4049: alpha and off in 1.35-1.36, where
kube builds no scorer and skips; beta and on in 1.37): per class, the utilization
``requested * 100 / capacity`` (100 when the capacity is 0 or too small) goes through the
``shape`` (default ``(0, 10), (100, 0)``, scores times 10: emptier storage scores higher,
integer interpolation truncating as Go's), and the node's score is the classes' mean,
rounded half away from zero. A node where some claim takes an existing PV scores those PVs
(requests and PV capacities summed per class); any other node scores its provisioned
claims that found a CSIStorageCapacity (requests summed, the capacity of the last claim's
object per class, as kube). A node with neither scores 0. Where no feasible node has
anything to score (no claims, only bound ones, no capacity tracking) kube scores 0
everywhere, which ranks nothing: Lattice skips. No normalisation; weight 1 (kube's default
profile). Classes are keyed by the claim's class; kube takes the PV's or the claim's
``spec.storageClassName``, which differs only where a beta class annotation disagrees.

Where kube is not deterministic or crashes, the choice here: among several
CSIStorageCapacities with room for a claim on a node kube takes whichever its lister gives
first (map order), Lattice the first by namespace and name; an object with
``maximumVolumeSize`` but no ``capacity`` scores as capacity 0 (kube dereferences nil).

:meth:`VolumeBinding.volume_plan` is kube's Reserve+PreBind as data: for the chosen node,
the PVs to bind (claimRef, ``bound-by-controller``) and the claims to annotate with the
selected node, in kube's write order, plus the claims to wait for before binding the pod.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import numpy as np

from scheduler.core.framework import (
    PREFILTER_SKIP,
    PREFILTER_SUCCESS,
    Code,
    Cycle,
    FilterResult,
    PreFilterResult,
)
from scheduler.core.profile import (
    DEFAULT_KUBE_MINOR,
    DEFAULT_VOLUME_SHAPE,
    MAX_SHAPE_SCORE,
    STORAGE_CAPACITY_SCORING_SINCE,
    VOLUME_BINDING,
    Profile,
    VolumeBindingArgs,
)
from scheduler.core.snapshot import BoolArray, IntArray, Snapshot
from scheduler.core.volumes import (
    Provisioning,
    StaticBinding,
    VolumePlan,
    VolumeState,
    ephemeral_owner_error,
    not_found,
    pod_claims,
    pv_affinity_mask,
    topology_mask,
)
from scheduler.model.pod import Pod
from scheduler.model.volume import (
    CLAIM_LOST,
    PV_AVAILABLE,
    CSIStorageCapacity,
    PersistentVolume,
    PersistentVolumeClaim,
)

NAME: Final = VOLUME_BINDING
REASON_NODE_CONFLICT: Final = "node(s) didn't match PersistentVolume's node affinity"
REASON_BIND_CONFLICT: Final = "node(s) didn't find available persistent volumes to bind"
REASON_NOT_ENOUGH_SPACE: Final = "node(s) did not have enough free storage"
REASON_PV_NOT_EXIST: Final = (
    "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"
)
REASON_UNBOUND_IMMEDIATE: Final = "pod has unbound immediate PersistentVolumeClaims"
_STATE: Final = NAME
MAX_UTILIZATION: Final = 100


@dataclass
class _Claims:
    bound: list[PersistentVolumeClaim] = field(default_factory=list)
    delayed: list[PersistentVolumeClaim] = field(default_factory=list)


@dataclass
class _Match:
    """One delayed claim's PV per node (``-1``: none) among ``candidates``."""

    claim: PersistentVolumeClaim
    candidates: list[PersistentVolume]
    chosen: IntArray


@dataclass
class _Provision:
    """A claim to provision on the nodes in ``needed``, with the CSIStorageCapacity
    ``hasEnoughCapacity`` found for it per node (index into ``capacities``, ``-1``: none,
    or capacity not tracked for its driver)."""

    claim: PersistentVolumeClaim
    needed: BoolArray
    capacities: list[CSIStorageCapacity]
    chosen: IntArray


@dataclass
class _Verdict:
    node_conflict: BoolArray
    bind_conflict: BoolArray
    no_space: BoolArray
    pv_missing: BoolArray
    matches: list[_Match]
    selected: list[PersistentVolumeClaim]
    provisions: list[_Provision]


def _read_claims(pod: Pod, volumes: VolumeState) -> _Claims | str:
    """``podHasPVCs`` then ``GetPodVolumeClaims``: the claims, or why the pod cannot go."""
    found: list[PersistentVolumeClaim] = []
    for claim, ephemeral in pod_claims(pod):
        pvc = volumes.pvcs.get((pod.namespace, claim))
        if pvc is None:
            if ephemeral:
                return (
                    "waiting for ephemeral volume controller to create the "
                    f'persistentvolumeclaim "{claim}"'
                )
            return not_found("persistentvolumeclaim", claim)
        if pvc.phase == CLAIM_LOST:
            return (
                f'persistentvolumeclaim "{pvc.name}" bound to non-existent '
                f'persistentvolume "{pvc.volume_name}"'
            )
        if pvc.deleting:
            return f'persistentvolumeclaim "{pvc.name}" is being deleted'
        if ephemeral and (error := ephemeral_owner_error(pod, pvc)) is not None:
            return error
        found.append(pvc)
    claims = _Claims()
    immediate = False
    for pvc in found:
        if pvc.fully_bound:
            claims.bound.append(pvc)
            continue
        storage_class = volumes.classes.get(pvc.storage_class) if pvc.storage_class else None
        if storage_class is not None and storage_class.binding_mode is None:
            return f'VolumeBindingMode not set for StorageClass "{storage_class.name}"'
        delayed = storage_class is not None and storage_class.delays_binding
        if delayed and not pvc.volume_name:
            claims.delayed.append(pvc)
        else:
            immediate = True
    if immediate:
        return REASON_UNBOUND_IMMEDIATE
    return claims


def _static_candidates(
    claim: PersistentVolumeClaim, volumes: VolumeState
) -> tuple[PersistentVolume | None, list[PersistentVolume]]:
    """``FindMatchingVolume``'s node-independent checks: a PV pre-bound to the claim (which
    wins if its affinity fits), and the other usable PVs, smallest first."""
    prebound: PersistentVolume | None = None
    usable: list[PersistentVolume] = []
    for pv in sorted(volumes.pvs_of_class(claim.storage_class), key=lambda p: p.name):
        if pv.claim_ref is not None and not pv.bound_to(claim):
            continue
        if pv.capacity < claim.request or pv.volume_mode != claim.volume_mode:
            continue
        if pv.attributes_class != claim.attributes_class or pv.deleting:
            continue
        if pv.bound_to(claim):
            prebound = prebound or pv
            continue
        if pv.phase != PV_AVAILABLE:
            continue
        if claim.selector is not None and not claim.selector.matches(pv.labels):
            continue
        if not set(claim.access_modes) <= set(pv.access_modes):
            continue
        usable.append(pv)
    usable.sort(key=lambda p: p.capacity)
    return prebound, usable


def _selector_mask(snapshot: Snapshot, capacity: CSIStorageCapacity) -> BoolArray:
    """``nodeHasAccess`` over every node: the ``nodeTopology`` selector (none: no node)."""
    n = snapshot.num_nodes
    selector = capacity.node_topology
    if selector is None or selector.selects_nothing:
        return np.zeros(n, dtype=np.bool_)
    mask = np.ones(n, dtype=np.bool_)
    for req in selector.requirements:
        mask &= snapshot.requirement_mask(req)
    return mask


def _capacity_check(
    snapshot: Snapshot,
    volumes: VolumeState,
    pvc: PersistentVolumeClaim,
    access: dict[tuple[str, str], BoolArray],
) -> tuple[list[CSIStorageCapacity], IntArray] | None:
    """``hasEnoughCapacity`` over every node: the capacities with room for the claim and
    the first one each node may use (``-1``: none, not enough storage there), or None when
    nothing is checked (no storage request, no CSIDriver, or one that does not opt in)."""
    storage_class = volumes.classes.get(pvc.storage_class)
    if storage_class is None or not pvc.storage_requested:
        return None
    driver = volumes.csi_drivers.get(storage_class.provisioner)
    if driver is None or not driver.storage_capacity:
        return None
    size = pvc.request.value()
    capacities = [
        c
        for c in volumes.capacities_of_class(storage_class.name)
        if (limit := c.volume_limit) is not None and limit.value() >= size
    ]
    chosen = np.full(snapshot.num_nodes, -1, dtype=np.int64)
    for k, capacity in enumerate(capacities):
        if capacity.key not in access:
            access[capacity.key] = _selector_mask(snapshot, capacity)
        chosen[(chosen < 0) & access[capacity.key]] = k
    return capacities, chosen


def _evaluate(snapshot: Snapshot, volumes: VolumeState, claims: _Claims) -> _Verdict:
    n = snapshot.num_nodes
    names = np.asarray(snapshot.node_names, dtype=object)
    node_conflict = np.zeros(n, dtype=np.bool_)
    pv_missing = np.zeros(n, dtype=np.bool_)
    undecided = np.ones(n, dtype=np.bool_)
    for pvc in claims.bound:
        pv = volumes.pvs.get(pvc.volume_name)
        if pv is None:
            pv_missing |= undecided
            undecided[:] = False
            break
        fits = pv_affinity_mask(snapshot, pv)
        node_conflict |= undecided & ~fits
        undecided &= fits

    selected = [c for c in claims.delayed if c.selected_node is not None]
    to_match = sorted(
        (c for c in claims.delayed if c.selected_node is None), key=lambda c: c.request
    )
    # The selected-node fast path: any other node fails at once, before matching.
    elsewhere = np.zeros(n, dtype=np.bool_)
    for pvc in selected:
        elsewhere |= names != pvc.selected_node

    provisionable: dict[str, BoolArray] = {}

    def can_provision(pvc: PersistentVolumeClaim) -> BoolArray:
        if pvc.storage_class not in provisionable:
            storage_class = volumes.classes.get(pvc.storage_class)
            if storage_class is None or not storage_class.can_provision:
                provisionable[pvc.storage_class] = np.zeros(n, dtype=np.bool_)
            else:
                provisionable[pvc.storage_class] = topology_mask(
                    snapshot, storage_class.allowed_topologies
                )
        return provisionable[pvc.storage_class]

    matches: list[_Match] = []
    taken: dict[str, BoolArray] = {}
    for pvc in to_match:
        prebound, usable = _static_candidates(pvc, volumes)
        chosen = np.full(n, -1, dtype=np.int64)
        candidates = [prebound] if prebound is not None else usable
        for k, pv in enumerate(candidates):
            free = chosen == -1
            if pv.name in taken:
                free &= ~taken[pv.name]
            hit = free & pv_affinity_mask(snapshot, pv)
            chosen[hit] = k
        for k, pv in enumerate(candidates):
            here = chosen == k
            taken[pv.name] = taken[pv.name] | here if pv.name in taken else here
        matches.append(_Match(pvc, candidates, chosen))

    # checkVolumeProvisions, node by node in kube's order: the first claim that cannot be
    # provisioned there (bind conflict) or has no room (not enough space) decides.
    bind_conflict = elsewhere.copy()
    no_space = np.zeros(n, dtype=np.bool_)
    decided = elsewhere.copy()
    access: dict[tuple[str, str], BoolArray] = {}
    provisions: list[_Provision] = []
    to_provision = [(c, np.ones(n, dtype=np.bool_)) for c in selected]
    to_provision += [(m.claim, m.chosen < 0) for m in matches]
    for pvc, needed in to_provision:
        active = needed & ~decided
        ok = can_provision(pvc)
        cannot = active & ~ok
        bind_conflict |= cannot
        decided |= cannot
        check = _capacity_check(snapshot, volumes, pvc, access)
        if check is None:
            continue
        capacities, chosen = check
        short = active & ok & (chosen < 0)
        no_space |= short
        decided |= short
        provisions.append(_Provision(pvc, needed, capacities, chosen))
    return _Verdict(
        node_conflict, bind_conflict, no_space, pv_missing, matches, selected, provisions
    )


def broken_linear(utilization: IntArray, shape: tuple[tuple[int, int], ...]) -> IntArray:
    """``BuildBrokenLinearFunction``: the first point at or above the utilization decides;
    between points, linear in int64 with Go's division (truncating toward zero)."""
    scores = np.full(utilization.shape, shape[-1][1], dtype=np.int64)
    done = np.zeros(utilization.shape, dtype=np.bool_)
    for i, (at, score) in enumerate(shape):
        here = ~done & (utilization <= at)
        if i == 0:
            scores[here] = score
        else:
            before, low = shape[i - 1]
            rise = (score - low) * (utilization[here] - before)
            run = at - before
            scores[here] = low + np.sign(rise) * (np.abs(rise) // run)
        done |= here
    return scores


def utilization_scores(
    requested: IntArray, capacity: IntArray, shape: tuple[tuple[int, int], ...]
) -> IntArray:
    """kube's per-class score: the utilization through the shape; full (100 %) when the
    capacity is 0 or smaller than the request."""
    full = (capacity == 0) | (requested > capacity)
    utilization = np.where(
        full, MAX_UTILIZATION, requested * MAX_UTILIZATION // np.where(full, 1, capacity)
    )
    return broken_linear(utilization, shape)


class VolumeBinding:
    name: Final = NAME

    def __init__(
        self, args: VolumeBindingArgs | None = None, *, kube_minor: int = DEFAULT_KUBE_MINOR
    ) -> None:
        args = args or VolumeBindingArgs()
        self.shape: tuple[tuple[int, int], ...] | None = None
        """The score's shape in 0..100 scores; None before 1.37 (no scorer in kube)."""
        if kube_minor >= STORAGE_CAPACITY_SCORING_SINCE:
            points = args.shape if args.shape is not None else DEFAULT_VOLUME_SHAPE
            self.shape = tuple((u, score * (100 // MAX_SHAPE_SCORE)) for u, score in points)

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        volumes = cycle.volumes
        if volumes is None or not pod_claims(cycle.pod):
            return PREFILTER_SKIP
        claims = _read_claims(cycle.pod, volumes)
        if isinstance(claims, str):
            return PreFilterResult(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, claims)
        cycle.state[_STATE] = claims
        return PREFILTER_SUCCESS

    def _verdict(self, cycle: Cycle) -> _Verdict | None:
        claims = cycle.state.get(_STATE)
        if claims is None or cycle.volumes is None:
            return None
        key = f"{_STATE}/verdict"
        if key not in cycle.state:
            cycle.state[key] = _evaluate(cycle.snapshot, cycle.volumes, claims)
        verdict: _Verdict = cycle.state[key]
        return verdict

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        verdict = self._verdict(cycle)
        if verdict is None:
            return None
        reasons = tuple(
            (reason, mask)
            for reason, mask in (
                (REASON_NODE_CONFLICT, verdict.node_conflict),
                (REASON_BIND_CONFLICT, verdict.bind_conflict),
                (REASON_NOT_ENOUGH_SPACE, verdict.no_space),
                (REASON_PV_NOT_EXIST, verdict.pv_missing),
            )
            if mask.any()
        )
        if not reasons:
            return None
        rejected = np.logical_or.reduce([m for _, m in reasons])
        codes = np.where(rejected, np.int8(Code.UNSCHEDULABLE_AND_UNRESOLVABLE), np.int8(0))
        return FilterResult(codes.astype(np.int8), reasons)

    def score(self, cycle: Cycle, feasible: BoolArray) -> IntArray | None:
        """kube's Score with StorageCapacityScoring (see the module docstring)."""
        shape = self.shape
        verdict = self._verdict(cycle) if shape is not None else None
        if shape is None or verdict is None:
            return None
        n = cycle.num_nodes
        static = _Usage(n)
        for match in verdict.matches:
            bound = match.chosen >= 0
            if not bound.any():
                continue
            sizes = np.array([pv.capacity.value() for pv in match.candidates], dtype=np.int64)
            static.add(
                match.claim.storage_class,
                bound,
                match.claim.request.value(),
                sizes[np.maximum(match.chosen, 0)],
            )
        dynamic = _Usage(n)
        for provision in verdict.provisions:
            found = provision.needed & (provision.chosen >= 0)
            if not found.any():
                continue
            sizes = np.array(
                [c.capacity.value() if c.capacity is not None else 0 for c in provision.capacities],
                dtype=np.int64,
            )
            dynamic.add(
                provision.claim.storage_class,
                found,
                provision.claim.request.value(),
                sizes[np.maximum(provision.chosen, 0)],
                replace=True,
            )
        has_static = static.any()
        total = np.zeros(n, dtype=np.int64)
        classes = np.zeros(n, dtype=np.int64)
        for usage, rows in ((static, has_static), (dynamic, ~has_static)):
            for present, requested, capacity in usage.classes.values():
                scored = present & rows
                total += np.where(scored, utilization_scores(requested, capacity, shape), 0)
                classes += scored
        if not (classes[feasible] > 0).any():
            return None  # kube: 0 on every node
        # math.Round(total / classes): half away from zero; both are non-negative.
        scores: IntArray = np.where(
            classes > 0, (2 * total + classes) // (2 * np.maximum(classes, 1)), 0
        )
        return scores

    def volume_plan(self, cycle: Cycle, row: int) -> VolumePlan | None:
        verdict = self._verdict(cycle)
        if verdict is None:
            return None
        node = cycle.snapshot.node_names[row]
        static: list[StaticBinding] = []
        provisions = [
            Provisioning(c.namespace, c.name, node, c.resource_version) for c in verdict.selected
        ]
        for match in verdict.matches:
            pvc, k = match.claim, int(match.chosen[row])
            if k < 0:
                provisions.append(Provisioning(pvc.namespace, pvc.name, node, pvc.resource_version))
                continue
            pv = match.candidates[k]
            static.append(
                StaticBinding(
                    pv=pv.name,
                    claim_namespace=pvc.namespace,
                    claim_name=pvc.name,
                    claim_uid=pvc.uid,
                    claim_resource_version=pvc.resource_version,
                    pv_resource_version=pv.resource_version,
                    set_bound_by_controller=not pv.bound_to(pvc),
                )
            )
        if not static and not provisions:
            return None
        claims = tuple((s.claim_namespace, s.claim_name) for s in static) + tuple(
            (p.claim_namespace, p.claim_name) for p in provisions
        )
        return VolumePlan(node, tuple(static), tuple(provisions), claims)


class _Usage:
    """Requested and capacity bytes per storage class per node, for the score."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.classes: dict[str, tuple[BoolArray, IntArray, IntArray]] = {}

    def add(
        self,
        storage_class: str,
        rows: BoolArray,
        requested: int,
        capacity: IntArray,
        *,
        replace: bool = False,
    ) -> None:
        """Count a claim's request at ``rows``; its capacity is added (static PVs) or, with
        ``replace``, overwrites the class's (kube's ``=`` for provisioned claims)."""
        if storage_class not in self.classes:
            self.classes[storage_class] = (
                np.zeros(self.n, dtype=np.bool_),
                np.zeros(self.n, dtype=np.int64),
                np.zeros(self.n, dtype=np.int64),
            )
        present, req, cap = self.classes[storage_class]
        present |= rows
        req[rows] += requested
        cap[rows] = capacity[rows] if replace else cap[rows] + capacity[rows]

    def any(self) -> BoolArray:
        rows = np.zeros(self.n, dtype=np.bool_)
        for present, _, _ in self.classes.values():
            rows |= present
        return rows


def plan_volume_bindings(
    snapshot: Snapshot, volumes: VolumeState, pod: Pod, node: str
) -> VolumePlan | None:
    """The writes to make before binding ``pod`` to ``node`` (None: nothing to write).

    For a controller that has the decision but not its cycle: VolumeBinding's PreFilter and
    Filter are re-run for that node alone. Raises ValueError when the node does not fit.
    """
    row = snapshot.index_of(node)
    if row is None:
        raise ValueError(f"node {node!r} is not in the snapshot")
    plugin = VolumeBinding()
    cycle = Cycle(snapshot, pod, volumes=volumes)
    pre = plugin.pre_filter(cycle)
    if pre.code is Code.SKIP:
        return None
    if pre.rejected:
        raise ValueError(f"pod does not fit: {pre.message}")
    candidates = np.zeros(snapshot.num_nodes, dtype=np.bool_)
    candidates[row] = True
    verdict = plugin.filter(cycle, candidates)
    if verdict is not None and verdict.codes[row]:
        raise ValueError(f"node {node!r} does not fit: {', '.join(verdict.reasons_at(row))}")
    return plugin.volume_plan(cycle, row)


def new(profile: Profile) -> VolumeBinding:
    return VolumeBinding(profile.volume_binding, kube_minor=profile.kube_minor)

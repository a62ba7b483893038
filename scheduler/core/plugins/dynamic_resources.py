"""DynamicResources: allocate a pod's ResourceClaims on the node it goes to, and score
prioritized lists (kube-scheduler 1.35-1.37).

Theory of operation, kube-scheduler's plugin of the same name with its default gates:

* **PreFilter** resolves ``spec.resourceClaims`` in order: a ``resourceClaimName`` names the
  claim; a template's claim is the one ``status.resourceClaimStatuses`` names (no entry
  yet: the pod waits for kube-controller-manager to create it; an entry without a name: the
  claim is not needed and is skipped) and must be controlled by the pod. A missing or
  deleting claim, a missing DeviceClass, a request of unknown type or a claim another pod
  is still being allocated (assumed, not yet written) reject the pod as
  UnschedulableAndUnresolvable, as every DRA status of kube's is; the queue wakes it on a
  claim, class or slice change. An allocated claim (shared, or allocated before) only
  needs its ``allocation.nodeSelector``.
* **Filter** per node: a node outside ``spec.dra.nodeSelector`` (Lattice's own DRA nodes,
  :class:`~scheduler.core.profile.DynamicResourcesArgs`) cannot allocate anything new;
  allocated claims must be available on the node; the unallocated ones go through the
  structured allocator (:mod:`scheduler.core.dra.allocator`). A failure is "cannot
  allocate all claims", Unschedulable where some device of the node is in use (kube:
  always UnschedulableAndUnresolvable) so that preemption may free devices held by
  lower-priority pods. Where untolerated device taints keep some request from enough
  devices, the reason names them (kube says only "cannot allocate all claims"; Lattice
  appends ``(untolerated device taint: key=value:Effect)``, :func:`cannot_allocate`). An
  allocator error (a CEL runtime error, All over an incomplete pool, ...) is an Error
  status, which ends the pod's whole attempt (SchedulerError and backoff), as in kube.
  The search over the nodes has a budget per attempt and, in the controller, runs off
  the event loop (:mod:`scheduler.core.dra.search`: the attempt's
  :class:`~scheduler.core.dra.search.DeviceSearch`, or one of the cycle's own).
* **Binding conditions** (1.36+, :mod:`scheduler.core.dra.binding`): an allocated claim
  whose device's binding failure condition is True, or whose binding timed out
  (``spec.dra.bindingTimeoutSeconds`` from its ``allocationTimestamp``), is available on
  no node (kube's Filter), so that PostFilter gives it back. The controller's PreBind
  waits for the conditions before the binding.
* **PostFilter** (:func:`stale_allocations`, run by the controller when no node fits):
  as kube 1.34+, one of the pod's allocated claims that nobody else holds and that some
  node reaching DynamicResources' filter cannot use (or whose binding failed) is
  deallocated, so the next attempt can allocate anew, elsewhere.
* **Score** (kube 1.35+, kubernetes#134711; weight 2 in the default profile of every
  supported release): prioritized lists only. Per node, over the pod's claims in order,
  each ``firstAvailable`` request adds ``8 - index`` of the subrequest its allocation on
  that node chose (:func:`~scheduler.core.dra.allocator.chosen_subrequests`; ``exactly``
  requests add nothing); then kube's ``DefaultNormalizeScore``: ``100 * raw // max`` over
  the feasible nodes, all 0 when the max is 0. The allocation read is the one Filter made
  for that node (kube's ``nodeAllocations``, here the per-row results, memo hits
  included); a claim allocated already reads its ``status.allocation`` (the same on every
  node). A pod that allocates nothing new (no claims, or all allocated) scores 0 everywhere
  (kube has no Filter result to read): the plugin skips, which adds the same to every total.
  kube 1.35.4 indexes the Filter results by the claim's position among *all* the pod's
  claims, so a pod with an allocated and an unallocated claim makes its Score fail (an
  error of the attempt, with two or more feasible nodes); 1.36 fixed that, and Lattice
  scores such pods as 1.36 does in every release rather than copy the failure.
* **Device fit** (:func:`device_fits`, scored by GPUPlacement, Lattice's own): per node,
  how the allocation sits on the node's devices, so the node choice can fill partly used
  PCIe roots and nodes first and keep whole ones for big claims. GPUPlacement ranks by the
  prioritized-list preference above before fit (see its docstring), so packing never
  gives a pod a later alternative while a node offers it an earlier one.
* **ClaimPlan** (after selection, kube's Reserve/PreBind as data): the allocations for the
  chosen node and the claims to reserve for the pod. The controller assumes the plan in its
  :class:`~scheduler.core.dra.state.DraState` (so the next cycle never offers those devices)
  and writes it before the binding.

* **Extended resources** (DRAExtendedResource, from 1.36: :mod:`scheduler.core.dra.extended`):
  a pod asking for a name a DeviceClass serves gets, per node whose allocatable lacks it,
  one more claim to allocate with its own; the plan creates it (PreBind). A claim made for
  the pod in an earlier attempt (a binding that failed and whose claim was not deleted)
  fails every node as kube's "cannot schedule extended resource claim", and PostFilter
  (:func:`stale_extended_claim`) deletes it so that the next attempt starts anew.

Claims whose requests use alpha fields are refused before this plugin by Unsupported;
device taints and tolerations are not alpha any more (DRADeviceTaints, on since 1.36).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

import numpy as np

from scheduler.core.dra import extended
from scheduler.core.dra.allocator import (
    PCIE_ROOT,
    TIMEOUT_IS_ERROR_FROM,
    AllocationError,
    Allocator,
    BudgetExhausted,
    NodeAllocationError,
    chosen_subrequests,
)
from scheduler.core.dra.binding import binding_check
from scheduler.core.dra.objects import (
    BINDING_CONDITIONS_SINCE_MINOR,
    FIRST_AVAILABLE_MAX,
    DeviceId,
    ResourceClaim,
    Share,
    allocation_usage,
    requests_of,
)
from scheduler.core.dra.search import CANNOT_ALLOCATE as CANNOT_ALLOCATE
from scheduler.core.dra.search import (
    ON_LOOP_BUDGET,
    DeviceSearch,
    Failed,
    Fit,
    Job,
    NoFit,
    Outcome,
    search_node,
)
from scheduler.core.dra.search import cannot_allocate as cannot_allocate
from scheduler.core.dra.state import (
    ClaimPlan,
    ClaimWrite,
    DraState,
    ExtendedClaim,
    Hold,
    with_shares,
)
from scheduler.core.framework import (
    PREFILTER_SKIP,
    Code,
    Cycle,
    FilterResult,
    PreFilterResult,
)
from scheduler.core.plugins._normalize import default_normalize
from scheduler.core.profile import DYNAMIC_RESOURCES, DynamicResourcesArgs, GpuPolicy, Profile
from scheduler.core.snapshot import BoolArray, IntArray, Snapshot
from scheduler.model.names import is_dra_extended_resource
from scheduler.model.pod import Pod
from scheduler.model.release import DEFAULT_KUBE_MINOR

NAME: Final = DYNAMIC_RESOURCES
NOT_AVAILABLE: Final = "resourceclaim not available on the node"
OUTSIDE: Final = "node(s) outside Lattice's DRA nodes (LatticeScheduler spec.dra.nodeSelector)"
NO_STATE: Final = "Lattice allocates DRA resource claims only with the cluster's DRA objects"
PENDING: Final = "node(s) not searched yet: the device search runs off the event loop"
"""The reason of rows a deferred search left for its worker (that decision is never used)."""
MEMO_LIMIT: Final = 200_000
"""Entries the per-node memo may hold before it starts again (outcomes of nodes whose
devices changed since are never read again)."""


@dataclass(frozen=True, slots=True)
class _Variant:
    """The claim for the extended resources one kind of node serves by DRA."""

    claim: ResourceClaim
    mappings: tuple[extended.RequestMapping, ...]
    specs: int
    """The memo's claim part for the pod's claims plus this one."""


@dataclass(slots=True)
class _Extended:
    """The pod's DRA-backed extended resources (kube's ``draExtendedResource``)."""

    requests: dict[str, int]
    """Every extended resource name the pod requests, with a serving class or not."""
    served: frozenset[str]
    """Those a DeviceClass serves."""
    stale: ResourceClaim | None
    """A claim made for the pod in an earlier attempt: PostFilter deletes it first."""
    variants: dict[frozenset[str], _Variant] = field(default_factory=dict)
    rows: dict[int, _Variant] = field(default_factory=dict)
    """Per node row serving some resource by DRA: its claim (the last allocation)."""


@dataclass(slots=True)
class _State:
    allocated: list[ResourceClaim]
    to_allocate: list[ResourceClaim]
    order: list[ResourceClaim]
    allocator: Allocator | None
    results: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    specs: int = 0
    """What the allocator reads of ``to_allocate``, interned (the memo's claim part)."""
    keys: dict[int, tuple[object, ...]] = field(default_factory=dict)
    """Per row with results: its memo key (:meth:`DraState.node_key`)."""
    preference: IntArray | None = None
    """kube's raw prioritized-list score per row, once computed (Score and GPUPlacement
    both read it)."""
    extended: _Extended | None = None
    search: DeviceSearch = field(default_factory=DeviceSearch)
    """The attempt's device search: the controller's (deferred, shared by its decisions)
    or one of this cycle's own (inline, with the profile's budget)."""
    unusable: bool = False
    """An allocated claim's binding failed or timed out (1.36+): no node is available."""


_NO_FIT: Final = object()
"""Memo value: the claims do not fit on the node."""


def _specs(claims: list[ResourceClaim]) -> object:
    """The claims as the allocator reads them: namespace (adminAccess), requests,
    constraints, configs (results name requests and carry configs, so equal specs give
    equal results on one node)."""
    return tuple((c.namespace, c.requests, c.constraints, repr(c.config)) for c in claims)


RESERVED_FOR_MAX: Final = 256
"""``ResourceClaimReservedForMaxSize``: the API server refuses a claim reserved for more
consumers. kube-scheduler does not check it (``CanBeReserved`` is always true) and fails at
PreBind with an error and backoff; Lattice refuses the pod in PreFilter instead, so it waits
(unschedulable) until a reservation is released, which wakes it."""


def _reject(message: str) -> PreFilterResult:
    return PreFilterResult(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, message)


class DynamicResources:
    name: Final = NAME

    def __init__(
        self,
        args: DynamicResourcesArgs | None = None,
        *,
        aligned: bool = True,
        extended_resources: bool = True,
        compact_config: bool = True,
        stamp_allocation: bool = True,
        kube_minor: int = DEFAULT_KUBE_MINOR,
    ) -> None:
        self.kube_minor = kube_minor
        """The release whose allocator runs (partitionable devices from 1.36)."""
        self.args = args or DynamicResourcesArgs()
        self.aligned = aligned
        """The allocator's root-aware device order (GPUPlacement's Fragmentation policy)."""
        self.extended_resources = extended_resources
        """DRAExtendedResource (on from 1.36): extended resources served by DeviceClasses."""
        self.compact_config = compact_config
        """1.37's allocation ``devices.config`` form (:class:`Allocator`)."""
        self.stamp_allocation = stamp_allocation
        """``allocationTimestamp`` written with a reservation (1.36+, :class:`ClaimWrite`)."""

    @property
    def binding_timeout(self) -> float | None:
        """DRADeviceBindingConditions (1.36+): the binding timeout; None before."""
        if self.kube_minor < BINDING_CONDITIONS_SINCE_MINOR:
            return None
        return self.args.binding_timeout

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        pod = cycle.pod
        wants_extended = self.extended_resources and bool(pod.container_requests)
        if not pod.resource_claims and not wants_extended:
            return PREFILTER_SKIP
        dra = cycle.dra
        if dra is None:
            return _reject(NO_STATE) if pod.resource_claims else PREFILTER_SKIP
        state = _State([], [], [], None)
        if wants_extended:
            state.extended = _extended_of(pod, dra)
        for ref in pod.resource_claims:
            name = ref.claim_name
            if not name:
                if ref.name not in pod.generated_claims:
                    return _reject(
                        f'waiting for resource claim "{ref.name}" of pod {pod.namespace}/'
                        f"{pod.name} to be created from ResourceClaimTemplate "
                        f'"{ref.template_name}"'
                    )
                generated = pod.generated_claims[ref.name]
                if generated is None:
                    continue  # the resourceclaim controller decided none is needed
                name = generated
            claim = dra.claims.get((pod.namespace, name))
            if claim is None:
                return _reject(f'resourceclaim "{name}" not found')
            if claim.deleting:
                return _reject(f'resourceclaim "{name}" is being deleted')
            if not ref.claim_name and claim.controller_uid != pod.uid:
                return _reject(
                    f"ResourceClaim {pod.namespace}/{name} was not created for pod "
                    f"{pod.namespace}/{pod.name} (pod is not owner)"
                )
            if any(c.key == claim.key for c in state.order):
                continue  # two entries naming one claim: it is allocated once
            state.order.append(claim)
            if claim.allocation is not None:
                if len(claim.reserved_for) >= RESERVED_FOR_MAX and not any(
                    r.uid == pod.uid for r in claim.reserved_for
                ):
                    return _reject(
                        f'resourceclaim "{name}" in use: its reservedFor already holds '
                        f"{RESERVED_FOR_MAX} consumers, the API server's limit"
                    )
                state.allocated.append(claim)
                continue
            pending = dra.pending_for(claim.key)
            if pending is not None and pending != pod.uid:
                return _reject(f'resourceclaim "{name}" is in the process of being allocated')
            for request in claim.requests:
                if request.exactly is None and not request.first_available:
                    return _reject(f'resourceclaim "{name}": unknown request type')
            missing = [c for c in requests_of([claim]) if c not in dra.classes]
            if missing:
                return _reject(f'resourceclaim "{name}": device class {missing[0]} does not exist')
            state.to_allocate.append(claim)
        if not state.order and state.extended is None:
            return PREFILTER_SKIP
        if state.to_allocate or (state.extended is not None and state.extended.stale is None):
            state.allocator = dra.allocator(
                aligned=self.aligned,
                compact_config=self.compact_config,
                kube_minor=self.kube_minor,
            )
            state.specs = dra.spec_id((self.aligned, _specs(state.to_allocate)))
        state.search = cycle.search or DeviceSearch(min(self.args.search_budget, ON_LOOP_BUDGET))
        state.unusable = any(
            binding_failed(c, self.binding_timeout, time.time()) for c in state.allocated
        )
        cycle.state[NAME] = state
        return PreFilterResult()

    def _variant(
        self, state: _State, ext: _Extended, served: frozenset[str], cycle: Cycle
    ) -> _Variant:
        """The claim for the resources a node serves by DRA (nodes alike share it)."""
        variant = ext.variants.get(served)
        if variant is None:
            dra = cycle.dra
            assert dra is not None
            claim, mappings = _extended_claim(cycle.pod, dra, served)
            claims = [*state.to_allocate, claim]
            specs = dra.spec_id((self.aligned, _specs(claims)))
            variant = ext.variants[served] = _Variant(claim, mappings, specs)
        return variant

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        state: _State | None = cycle.state.get(NAME)
        if state is None:
            return None
        snapshot = cycle.snapshot
        ext = state.extended
        if ext is not None and ext.stale is not None:
            return FilterResult.from_mask(
                candidates.copy(), extended.STALE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE
            )
        dra = cycle.dra
        if dra is not None and len(dra.memo) > MEMO_LIMIT:
            dra.memo.clear()
        codes = np.zeros(snapshot.num_nodes, dtype=np.int8)
        not_available = np.zeros(snapshot.num_nodes, dtype=np.bool_)
        cannot: dict[str, BoolArray] = {}
        cannot_fit = np.zeros(snapshot.num_nodes, dtype=np.bool_)
        outside = np.zeros(snapshot.num_nodes, dtype=np.bool_)
        errors: dict[str, BoolArray] = {}
        unsearched = np.zeros(snapshot.num_nodes, dtype=np.bool_)
        """Rows left for the worker (deferred), or past the budget."""
        enough = np.zeros(snapshot.num_nodes, dtype=np.bool_)
        fits = 0
        search = state.search
        own = self.args.node_selector
        provided = _provided(snapshot, ext)
        for row in np.flatnonzero(candidates):
            node = snapshot.node(int(row))
            claims, specs = state.to_allocate, state.specs
            if ext is not None:
                lacking = _served_by_dra(ext, provided, int(row))
                if lacking is None:
                    cannot_fit[row] = True
                    codes[row] = Code.UNSCHEDULABLE_AND_UNRESOLVABLE
                    continue
                if lacking:
                    variant = self._variant(state, ext, lacking, cycle)
                    ext.rows[int(row)] = variant
                    claims, specs = [*claims, variant.claim], variant.specs
            if claims and not own.is_empty and not own.matches(node.labels):
                outside[row] = True
                codes[row] = Code.UNSCHEDULABLE_AND_UNRESOLVABLE
                continue
            if state.unusable or any(
                c.allocation_node_selector is not None
                and not c.allocation_node_selector.matches(node.labels, node.name)
                for c in state.allocated
            ):
                not_available[row] = True
                codes[row] = Code.UNSCHEDULABLE_AND_UNRESOLVABLE
                continue
            if state.allocator is None or not claims:
                continue
            allocator = state.allocator
            key = None
            if dra is not None:
                pools = allocator.slices.pools(node.name, node.labels, allocator.kube_minor)
                key = dra.node_key(node.name, pools, specs)
                hit = dra.memo.get(("allocate", *key))
                if hit is not None:
                    if hit is _NO_FIT:
                        reason = cast(str, dra.memo[("reason", *key)])
                        _mark(cannot, reason, int(row), snapshot.num_nodes)
                        codes[row] = cast(int, dra.memo[("in_use", *key)])
                    else:
                        state.results[int(row)] = cast(list[dict[str, Any]], hit)
                        state.keys[int(row)] = key
                        fits += 1
                    continue
            outcome = search.outcomes.get(key) if key is not None else None
            if outcome is None:
                if search.enough is not None and fits >= search.enough:
                    enough[row] = True
                    codes[row] = Code.UNSCHEDULABLE
                    continue
                if search.cut == node.name and self.kube_minor >= TIMEOUT_IS_ERROR_FROM:
                    # kube's search of this node would have gone on to its own timeout,
                    # an error of the attempt from 1.36: so is the budget's end.
                    _mark(errors, search.cut_message(node.name), int(row), snapshot.num_nodes)
                    codes[row] = Code.ERROR
                    break
                if search.expired():
                    # Preemption's dry run could not search it within the budget either.
                    unsearched[row] = True
                    codes[row] = Code.UNSCHEDULABLE_AND_UNRESOLVABLE
                    continue
                if search.deferred and key is not None:
                    outcome = search.inline_search(allocator, node.name, node.labels, claims)
                    if outcome is None:
                        search.jobs.append(
                            Job(int(row), node.name, node.labels, tuple(claims), key, allocator)
                        )
                        unsearched[row] = True
                        codes[row] = Code.UNSCHEDULABLE
                        continue
                else:
                    search.searched += 1
                    try:
                        outcome = search_node(
                            allocator, node.name, node.labels, claims, stop_at=search.deadline
                        )
                    except BudgetExhausted:
                        search.exhausted = True
                        search.cut = node.name
                        if self.kube_minor >= TIMEOUT_IS_ERROR_FROM:
                            _mark(
                                errors,
                                search.cut_message(node.name),
                                int(row),
                                snapshot.num_nodes,
                            )
                            codes[row] = Code.ERROR
                            break
                        unsearched[row] = True
                        codes[row] = Code.UNSCHEDULABLE_AND_UNRESOLVABLE
                        continue
                if key is not None and dra is not None:
                    remember(dra, key, outcome)
            if isinstance(outcome, Failed):
                _mark(errors, outcome.message, int(row), snapshot.num_nodes)
                codes[row] = Code.ERROR
                break  # kube aborts the whole attempt at the first error
            if isinstance(outcome, NoFit):
                _mark(cannot, outcome.reason, int(row), snapshot.num_nodes)
                codes[row] = outcome.code
                continue
            state.results[int(row)] = outcome.allocations
            fits += 1
            if key is not None:
                state.keys[int(row)] = key
        if unsearched.any():
            cannot[PENDING if search.jobs else search.over_budget()] = unsearched
        if enough.any():
            cannot[_enough_found(int(fits))] = enough
        reasons = (
            tuple(
                (reason, mask)
                for reason, mask in (
                    (OUTSIDE, outside),
                    (NOT_AVAILABLE, not_available),
                    (extended.CANNOT_FIT, cannot_fit),
                )
                if mask.any()
            )
            + tuple(cannot.items())
            + tuple(errors.items())
        )
        if not reasons:
            return None
        return FilterResult(codes, reasons)

    def score(self, cycle: Cycle, feasible: BoolArray) -> IntArray | None:
        """kube's Score and NormalizeScore (see the module docstring); None (skip) where
        kube scores 0 on every feasible node."""
        raw = prioritized_list_scores(cycle)
        if raw is None or not raw.any(where=feasible):
            return None
        return default_normalize(raw, feasible, reverse=False)

    def claim_plan(self, cycle: Cycle, row: int) -> ClaimPlan | None:
        state: _State | None = cycle.state.get(NAME)
        if state is None:
            return None
        pod = cycle.pod
        allocations = iter(state.results.get(row, ()))
        stamp = self.stamp_allocation
        writes: list[ClaimWrite] = []
        for claim in state.order:
            if claim.allocation is None:
                writes.append(
                    ClaimWrite(
                        claim.namespace, claim.name, claim.uid, next(allocations), stamp=stamp
                    )
                )
            elif not any(r.uid == pod.uid for r in claim.reserved_for):
                writes.append(ClaimWrite(claim.namespace, claim.name, claim.uid, None, stamp=stamp))
        variant = state.extended.rows.get(row) if state.extended is not None else None
        if variant is not None:
            made = variant.claim
            create = ExtendedClaim(
                extended.claim_body(pod, made.requests),
                tuple(m.body() for m in variant.mappings),
            )
            writes.append(
                ClaimWrite(made.namespace, made.name, "", next(allocations), create, stamp=stamp)
            )
        return ClaimPlan(pod.name, pod.uid, tuple(writes))

    def _nominee_claims(
        self, snapshot: Snapshot, nominee: Pod, row: int, dra: DraState
    ) -> list[ResourceClaim] | None:
        """What ``nominee``'s decision would allocate on node ``row``, as PreFilter and
        Filter resolve it: its unallocated claims, then the claim for the extended
        resources the node serves it by DRA. None where PreFilter or Filter would reject
        the nominee there (a claim missing, deleting or being allocated for another pod, a
        claim left by an earlier attempt, a resource neither the node nor a class
        provides): nothing to plan."""
        claims = unallocated_claims(nominee, dra)
        if claims is None:
            return None
        for c in claims:
            if c.deleting or dra.pending_for(c.key) not in (None, nominee.uid):
                return None
        if self.extended_resources and nominee.container_requests:
            ext = _extended_of(nominee, dra)
            if ext is not None:
                if ext.stale is not None:
                    return None
                lacking = _served_by_dra(ext, _provided(snapshot, ext), row)
                if lacking is None:
                    return None
                if lacking:
                    claims.append(_extended_claim(nominee, dra, lacking)[0])
        return claims

    def nominee_hold(
        self,
        snapshot: Snapshot,
        nominee: Pod,
        node_name: str,
        dra: DraState,
        taken: Hold,
    ) -> Hold:
        """The devices and shares ``nominee``'s unallocated claims would get on ``node_name``, its
        nominated node, so that a decision for a pod of lower or equal priority can count
        them as in use (:mod:`scheduler.core.nominated`). Planned with ``taken`` (devices
        and shares held for nominees before it) in use and the devices of the node's terminating
        pods of lower priority free: its victims, whose claims are released once they are
        gone, as preemption's dry run counted them; so the devices a victim frees are held
        from the moment it is gone, even while another victim still terminates.
        Empty where nothing can be planned: no unallocated claim, a claim missing or being
        allocated for another pod, the node outside Lattice's DRA nodes, no allocation,
        an allocator error or the on-loop budget spent (errors are not remembered). The
        claim for the nominee's DRA-backed extended resources is planned with its own
        claims, as its Filter would allocate them (:meth:`_nominee_claims`). The verdict is kept in
        the memo, keyed by the node's pools and versions, the claims' specs, the freed and
        the taken devices: a nomination costs one search per change of its node's devices."""
        row = snapshot.index_of(node_name)
        claims = None if row is None else self._nominee_claims(snapshot, nominee, row, dra)
        if row is None or not claims:
            return Hold()
        node = snapshot.node(row)
        own = self.args.node_selector
        if not own.is_empty and not own.matches(node.labels):
            return Hold()
        freed: set[DeviceId] = set()
        for other in snapshot.pods_on(row):
            claims_of = other.resource_claims or other.container_requests
            if other.terminating and other.priority < nominee.priority and claims_of:
                freed.update(dra.held_by(other.uid))
        allocator = dra.allocator(
            aligned=self.aligned,
            compact_config=self.compact_config,
            kube_minor=self.kube_minor,
            allocated=(dra.used_devices() - freed) | taken.devices,
            shared=with_shares(dra.shared_in_use(), taken.shares),
        )
        pools = allocator.slices.pools(node.name, node.labels, allocator.kube_minor)
        specs = dra.spec_id((self.aligned, _specs(claims)))
        key = ("nominee", *dra.node_key(node.name, pools, specs), frozenset(freed), taken.key())
        hit = dra.memo.get(key)
        if hit is not None:
            return Hold() if hit is _NO_FIT else cast(Hold, hit)
        try:
            found = allocator.allocate(
                node.name, node.labels, claims, stop_at=time.monotonic() + ON_LOOP_BUDGET
            )
        except (AllocationError, NodeAllocationError, BudgetExhausted):
            return Hold()
        if found is None:
            dra.memo[key] = _NO_FIT
            return Hold()
        devices: set[DeviceId] = set()
        shares: list[Share] = []
        for allocation in found:
            whole, parts = allocation_usage(allocation)
            devices.update(whole)
            shares += parts
        hold = Hold(frozenset(devices), tuple(shares))
        dra.memo[key] = hold
        return hold


def unallocated_claims(pod: Pod, dra: DraState) -> list[ResourceClaim] | None:
    """The pod's claims that still need devices, in pod order, named as PreFilter names
    them (None: some claim is missing or not created yet; PreFilter says why)."""
    out: list[ResourceClaim] = []
    for ref in pod.resource_claims:
        name = pod.claim_name(ref)
        if not name:
            if ref.claim_name or ref.name not in pod.generated_claims:
                return None
            continue  # the resourceclaim controller decided none is needed
        claim = dra.claims.get((pod.namespace, name))
        if claim is None:
            return None
        if claim.allocation is None and all(c.key != claim.key for c in out):
            out.append(claim)
    return out


def remember(dra: DraState, key: tuple[object, ...], outcome: Outcome) -> None:
    """A node's verdict into the memo (errors are not kept: kube retries them)."""
    if isinstance(outcome, Fit):
        dra.memo[("allocate", *key)] = outcome.allocations
    elif isinstance(outcome, NoFit):
        dra.memo[("allocate", *key)] = _NO_FIT
        dra.memo[("in_use", *key)] = outcome.code
        dra.memo[("reason", *key)] = outcome.reason


def _enough_found(fits: int) -> str:
    return f"node(s) not searched: {fits} node(s) with devices for the pod found already"


def _mark(masks: dict[str, BoolArray], reason: str, row: int, size: int) -> None:
    mask = masks.get(reason)
    if mask is None:
        mask = masks[reason] = np.zeros(size, dtype=np.bool_)
    mask[row] = True


def _subrequest_score(claim: ResourceClaim, allocation: Mapping[str, Any]) -> int:
    """One claim's part of kube's raw score: ``8 - index`` per chosen subrequest."""
    if all(r.exactly is not None for r in claim.requests):
        return 0  # nothing to read (the common case, kept cheap)
    return sum(FIRST_AVAILABLE_MAX - index for _, index in chosen_subrequests(claim, allocation))


def prioritized_list_scores(cycle: Cycle) -> IntArray | None:
    """kube's raw DynamicResources score per node row (before normalisation): rows with a
    new allocation for the pod get the sum over its claims; other rows 0. None when the
    pod allocates nothing new (kube then has no per-node allocation and scores 0)."""
    state: _State | None = cycle.state.get(NAME)
    if state is None or state.allocator is None:
        return None
    if state.preference is not None:
        return state.preference
    raw = np.zeros(cycle.snapshot.num_nodes, dtype=np.int64)
    if any(r.exactly is None for c in state.order for r in c.requests):
        held = sum(
            _subrequest_score(c, c.allocation) for c in state.allocated if c.allocation is not None
        )
        memo = cycle.dra.memo if cycle.dra is not None else None
        for row, allocations in state.results.items():
            # The memo key names Filter's result on the node, so it names this part too.
            key = state.keys.get(row)
            hit = memo.get(("prio", *key)) if memo is not None and key is not None else None
            if isinstance(hit, int):
                raw[row] = held + hit
                continue
            # Filter's results follow the claims to allocate, in pod order (kube 1.36+'s
            # separate index over the unallocated claims).
            # A node's extended-resource claim comes last and has only ``exactly`` requests
            # (it adds nothing), so the pod's own claims pair with the first results.
            part = sum(
                _subrequest_score(c, a)
                for c, a in zip(
                    state.to_allocate, allocations[: len(state.to_allocate)], strict=True
                )
            )
            raw[row] = held + part
            if memo is not None and key is not None:
                memo[("prio", *key)] = part
    state.preference = raw
    return raw


@dataclass(frozen=True, slots=True)
class DeviceFit:
    """How one node's allocation for the pod sits on that node's devices."""

    devices: int
    """Devices the allocation takes (adminAccess results take none)."""
    roots: int
    """Distinct PCIe roots among them (0: no device names one)."""
    left_on_roots: int
    """Free devices left on those roots afterwards, in the pools drawn from."""
    left_in_pools: int
    """Free devices left in the pools drawn from on the node afterwards (a device with a
    NoSchedule or NoExecute taint never counts: only claims tolerating it could use it)."""
    opens: bool = False
    """No device of the pools drawn from was in use before: the allocation breaks into a
    whole node (for a node's one GPU pool), the thing a later 8-device claim needs."""


def device_fits(cycle: Cycle) -> dict[int, DeviceFit]:
    """Per node row with a new allocation for the pod: its :class:`DeviceFit` (empty: the
    pod allocates nothing). Free means in no written or assumed allocation, and untainted."""
    state: _State | None = cycle.state.get(NAME)
    if state is None or state.allocator is None or not state.results:
        return {}
    allocator = state.allocator
    memo = cycle.dra.memo if cycle.dra is not None else None
    out: dict[int, DeviceFit] = {}
    for row, allocations in state.results.items():
        node_key = state.keys.get(row)
        if memo is not None and node_key is not None:
            hit = memo.get(("fit", *node_key))
            if isinstance(hit, DeviceFit):
                out[row] = hit
                continue
        chosen: set[DeviceId] = set()
        for allocation in allocations:
            for r in allocation["devices"]["results"]:
                if not r.get("adminAccess"):
                    chosen.add(DeviceId(r["driver"], r["pool"], r["device"]))
        pools = {(d.driver, d.pool) for d in chosen}
        node = cycle.snapshot.node(row)
        roots: set[tuple[str, object]] = set()
        free: list[tuple[str, object]] = []
        touched = False
        for pool in allocator.slices.pools(node.name, node.labels, allocator.kube_minor):
            if (pool.driver, pool.name) not in pools:
                continue
            for s in pool.slices:
                for d in s.devices:
                    root = d.attribute(PCIE_ROOT)
                    key = (pool.id, None if root is None else root.value)
                    device_id = DeviceId(s.driver, s.pool, d.name)
                    if device_id in chosen:
                        if root is not None:
                            roots.add(key)
                    elif device_id in allocator.allocated:
                        touched = True
                    elif d.allocatable(allocator.kube_minor) and not d.blocking_taints:
                        free.append(key)
        fit = DeviceFit(
            devices=len(chosen),
            roots=len(roots),
            left_on_roots=sum(1 for k in free if k in roots),
            left_in_pools=len(free),
            opens=bool(chosen) and not touched,
        )
        out[row] = fit
        if memo is not None and node_key is not None:
            memo[("fit", *node_key)] = fit
    return out


def _extended_of(pod: Pod, dra: DraState) -> _Extended | None:
    """kube's ``preFilterExtendedResources``: None unless the pod asks for a name some
    DeviceClass serves."""
    requests = {
        r: n for r, n in pod.resources.requests.items() if n > 0 and is_dra_extended_resource(r)
    }
    served = frozenset(r for r in requests if dra.extended_class(r) is not None)
    if not served:
        return None
    return _Extended(requests, served, dra.extended_claim(pod.uid, pod.name))


def _served_by_dra(
    ext: _Extended, provided: Mapping[str, BoolArray], row: int
) -> frozenset[str] | None:
    """The extended resources node ``row`` must serve the pod by DRA (its allocatable lacks
    them); None where one of them no DeviceClass serves either (kube's "cannot fit")."""
    lacking = frozenset(r for r in ext.requests if not provided[r][row])
    return None if lacking - ext.served else lacking


def _extended_claim(
    pod: Pod, dra: DraState, served: frozenset[str]
) -> tuple[ResourceClaim, tuple[extended.RequestMapping, ...]]:
    """The claim (under the pod's placeholder) serving ``served`` for the pod by DRA, and
    the pod's container-to-request mappings."""
    classes = {r: c for r in served if (c := dra.extended_class(r)) is not None}
    requests, mappings = extended.requests_and_mappings(pod, served, classes)
    return extended.node_claim(pod, requests), mappings


class ExtendedClaims:
    """Per node, the claim that would serve a pod's DRA-backed extended resources there
    (the names the node's allocatable lacks), for a caller that counts devices node by
    node as the commit allocates them: the gang model."""

    def __init__(self, pod: Pod, dra: DraState, snapshot: Snapshot, ext: _Extended) -> None:
        self._pod, self._dra, self._ext = pod, dra, ext
        self._provided = _provided(snapshot, ext)
        self._claims: dict[frozenset[str], ResourceClaim] = {}

    def at(self, row: int) -> ResourceClaim | None:
        """The claim node ``row`` must allocate for the pod's extended resources; None where
        its allocatable serves them all (NodeResourcesFit's) or some of them no class
        serves (the filter refused the node)."""
        lacking = _served_by_dra(self._ext, self._provided, row)
        if not lacking:
            return None
        claim = self._claims.get(lacking)
        if claim is None:
            claim = self._claims[lacking] = _extended_claim(self._pod, self._dra, lacking)[0]
        return claim


def extended_claims(
    pod: Pod, dra: DraState, snapshot: Snapshot, kube_minor: int
) -> ExtendedClaims | None:
    """:class:`ExtendedClaims` for a pod asking for a name some DeviceClass serves, on a
    release that serves them (DRAExtendedResource); None otherwise."""
    if kube_minor < extended.SINCE_MINOR:
        return None
    ext = _extended_of(pod, dra)
    return None if ext is None or ext.stale is not None else ExtendedClaims(pod, dra, snapshot, ext)


def _provided(snapshot: Snapshot, ext: _Extended | None) -> dict[str, BoolArray]:
    """Per extended resource the pod asks for: nodes whose allocatable has it (> 0)."""
    if ext is None:
        return {}
    out: dict[str, BoolArray] = {}
    for resource in ext.requests:
        column = snapshot.resource_column(resource)
        if column is None:
            out[resource] = np.zeros(snapshot.num_nodes, dtype=np.bool_)
        else:
            out[resource] = np.asarray(snapshot.allocatable[column] > 0, dtype=np.bool_)
    return out


def stale_extended_claim(pod: Pod, dra: DraState, *, enabled: bool = True) -> ResourceClaim | None:
    """kube's PostFilter for extended resources: the claim made for the pod in an earlier
    attempt, to delete (its deletion requeues the pod). None when there is none, or when no
    class serves the pod's extended resources any more (kube looks for the claim only
    then)."""
    if not enabled or not pod.container_requests:
        return None
    ext = _extended_of(pod, dra)
    return None if ext is None else ext.stale


def binding_failed(claim: ResourceClaim, timeout: float | None, now: float) -> bool:
    """kube's Filter check of an allocated claim (1.36+, ``timeout`` not None): a binding
    condition failed, or the binding timed out. Such a claim is available on no node, so
    that PostFilter gives its allocation back."""
    return timeout is not None and binding_check(claim, now=now, timeout=timeout).unusable


def stale_allocations(
    pod: Pod,
    dra: DraState,
    snapshot: Snapshot,
    reached: Collection[str],
    *,
    binding_timeout: float | None = None,
    now: float = 0.0,
) -> list[ResourceClaim]:
    """kube's PostFilter (1.34+), for a pod no node fits: the first of its allocated claims
    reserved for nobody but it whose allocation some node in ``reached`` (the nodes whose
    filters ran as far as DynamicResources') cannot use, to deallocate: its node selector
    leaves that node out, or (1.36+, ``binding_timeout`` set) its binding failed or timed
    out at wall time ``now`` (:func:`binding_failed`). The claim's change requeues the
    pod, which may then allocate anew, elsewhere. kube picks one such claim at random;
    Lattice takes the first in the pod's order (deterministic), one per attempt as kube
    does."""
    nodes = [n for n in (snapshot.index_of(name) for name in reached) if n is not None]
    if not nodes:
        return []
    for ref in pod.resource_claims:
        name = pod.claim_name(ref)
        claim = dra.claims.get((pod.namespace, name)) if name else None
        if claim is None or claim.allocation is None or claim.deleting:
            continue
        if any(r.uid != pod.uid for r in claim.reserved_for):
            continue
        if binding_failed(claim, binding_timeout, now):
            return [claim]
        selector = claim.allocation_node_selector
        if selector is None:
            continue
        for index in nodes:
            node = snapshot.node(index)
            if not selector.matches(node.labels, node.name):
                return [claim]
    return []


STAMP_SINCE_MINOR: Final = 36
"""kube-scheduler stamps ``allocationTimestamp`` from 1.36 (its binding-conditions gates on)."""
COMPACT_CONFIG_SINCE_MINOR: Final = 37
"""dynamic-resource-allocation v0.37 writes ``devices.config`` compactly (:class:`Allocator`)."""


def new(profile: Profile) -> DynamicResources:
    aligned = profile.gpu_placement.policy is GpuPolicy.FRAGMENTATION
    return DynamicResources(
        profile.dynamic_resources,
        aligned=aligned,
        extended_resources=profile.kube_minor >= extended.SINCE_MINOR,
        compact_config=profile.kube_minor >= COMPACT_CONFIG_SINCE_MINOR,
        stamp_allocation=profile.kube_minor >= STAMP_SINCE_MINOR,
        kube_minor=profile.kube_minor,
    )

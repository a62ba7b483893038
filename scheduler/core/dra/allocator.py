"""The structured allocator: a pod's unallocated claims -> devices on one node, or why not.

Theory of operation (kube-scheduler 1.34's ``structured`` allocator, with its default
feature gates: AdminAccess and PrioritizedList on, every alpha feature off):

1. **Pools seen from the node** (kube's ``GatherPools``). A slice is visible when its
   ``nodeName`` is the node, it has ``allNodes``, its ``nodeSelector`` matches the node,
   or (``perDeviceNodeSelection``, 1.36+) one of its devices names the node. Per (driver,
   pool) only the slices of the highest visible ``pool.generation`` count; when their
   number is not ``resourceSliceCount``, every slice of the pool is read: a newer
   generation anywhere drops the pool, too few at this one make it *incomplete*. It is
   *invalid* when a device name repeats, and (1.36+) when a counter set name repeats or a
   device consumes from a counter set or counter the pool lacks.
   Since 1.35 an ExactCount request takes no device from an incomplete or invalid pool
   (it goes on to the next pool); a node that then does not fit and saw an invalid pool
   is Unschedulable "invalid resource pools were encountered".
2. **Order.** kube 1.34 walks pools in Go map order (random per call). Lattice walks them
   sorted by (driver, pool), slices by name, devices in ``spec.devices`` order, so the same
   cluster always gives the same allocation. Where kube's choice is deterministic (one pool
   with one slice on the node) the two agree, except with ``aligned`` (GPUPlacement's
   Fragmentation policy, the default) in a pool whose devices name two or more
   ``resource.kubernetes.io/pcieRoot`` values: an ExactCount request then tries whole
   roots that hold its count first, fewest free devices first, then the others, most
   free first (:func:`_by_root`), so a claim's devices share a root where one can hold
   them and a 1-device claim fills a partly used root, keeping whole roots for claims
   that need them. From 1.36 (DRADeviceBindingConditions) the complete pools with a
   device that has ``bindingConditions`` come after the others, as in kube; on 1.35 a
   device with any binding field is passed over.
3. **Validation, per request (and per firstAvailable subrequest):** the class must exist; a
   selector that is not CEL is an error; ExactCount needs ``count`` devices; All takes every
   selectable device of every pool now, and an incomplete or invalid pool is an *error*;
   the minimum device count per claim must not exceed 32 (an error).
4. **Depth-first search** over claims, requests, subrequests and device slots, first full
   solution wins, with backtracking across requests and claims. For one slot the checks run
   cheapest first: in use (the cluster's allocated devices plus those picked earlier in
   this search; an adminAccess request only avoids devices already in its own claim), then
   class selectors, then request selectors (the verdict per device and request is memoised
   for the call; CEL verdicts per device and expression live on the device), then every
   constraint of the claim (``matchAttribute``: the first device fixes the value, later ones
   need the same type and value; a device without the attribute fails). Between the two,
   as kube's ``allocateDevice``: first a device that consumes counters (partitionable
   devices, 1.36+; on 1.35 it is passed over) must leave every counter of its pool
   covered, counting allocated devices and those picked so far (:func:`_reserve_counters`,
   given back on backtracking); then a device with a NoSchedule or NoExecute taint the
   request (or subrequest) does not tolerate is passed over (``None`` and unknown effects
   are ignored; adminAccess does not bypass it). Reaching an invalid pool in an ExactCount
   search is an error. All requests allocate their fixed devices with ``must``: a
   constraint they break is an error, a device in use or tainted against the request makes
   the request unsatisfiable. A claim that would exceed 32 results backtracks to the previous choice
   (and tries the next subrequest, which may need fewer devices).
5. **Results** in the ``status.allocation`` shape v1.34.4 writes: ``devices.results`` in
   allocation order (``adminAccess: true`` only for adminAccess requests; ``tolerations``, a
   copy of the request's, where it has any, as 1.36+ writes), ``devices.config``
   with each class's configs once per class naming the requests that used it (the v1.34.2+
   form) followed by the claim's configs (one copy per matching request, as kube does),
   each result with ``bindingConditions`` and ``bindingFailureConditions`` copied from its
   device (1.36+), and ``nodeSelector``: the node's name when any device comes from a
   node-local slice or is ``bindsToNode``, else the union of the slices' single-term
   selectors, else none (``allNodes`` only).
   Which ``firstAvailable`` subrequest a claim got is read back from these results
   (:func:`chosen_subrequests`), from a fresh allocation and from a written
   ``status.allocation`` alike, as kube's DynamicResources score reads it.

Outcomes: :meth:`Allocator.allocate` returns the allocations (one per claim, in order) or
None when the node cannot serve the claims; it raises :class:`AllocationError` for what kube
treats as an error of the whole attempt (CEL compile/runtime errors, All over an incomplete
pool, too many devices, an invalid pool reached). The search is bounded as kube bounds it
(DynamicResourcesArgs.filterTimeout, default 10 s, DRASchedulerFilterTimeout beta and on in
1.34): a search still running after
:data:`FILTER_TIMEOUT` gives up and the node does not fit (kube 1.34: Unschedulable, "timed
out trying to allocate devices"). Without it a claim asking for more devices than a node has
walks every permutation of the node's devices (16 devices: 16! orders) for hours. Over
a whole attempt the search is bounded further by its budget (``stop_at``,
:mod:`scheduler.core.dra.search`), and the controller runs it off the event loop.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from scheduler.core.dra.cel import CelError, SelectorCompiler
from scheduler.core.dra.objects import (
    ALL,
    BINDING_CONDITIONS_SINCE_MINOR,
    CONSUMABLE_CAPACITY_SINCE_MINOR,
    EXACT_COUNT,
    FROM_CLAIM,
    FROM_CLASS,
    RESULTS_MAX,
    Attribute,
    Counters,
    Device,
    DeviceClass,
    DeviceId,
    ExactRequest,
    RequestPolicy,
    ResourceClaim,
    ResourceSlice,
    untolerated,
)
from scheduler.model._fields import mapping, object_list
from scheduler.model.quantity import Quantity
from scheduler.model.release import DEFAULT_KUBE_MINOR
from scheduler.model.selectors import Labels

PCIE_ROOT: Final = "resource.kubernetes.io/pcieRoot"
"""The standard attribute naming a device's PCIe root complex (NVIDIA's driver sets it)."""
FILTER_TIMEOUT: Final = 10.0
"""Seconds one allocation may search (kube-scheduler 1.34's filterTimeout default)."""
_CLOCK_EVERY: Final = 256
"""Search steps between looks at the clock."""
PARTITIONABLE_SINCE_MINOR: Final = 36
"""DRAPartitionableDevices is beta and on in kube-scheduler from 1.36 (alpha, off, in 1.35)."""
FRACTIONAL_RANGE_SINCE_MINOR: Final = 38
"""DRAFractionalCapacityRange: a ``validRange`` whose bounds are whole milliunits is rounded
in milliunits. Beta in 1.37 but on only when ``--min-compatibility-version`` is 1.37, and a
component's default is one release back: kube-scheduler 1.37.2 as shipped rounds every value
up to whole units first, as 1.36 does (checked live: 150m under 100m steps is written as 1).
From 1.38 the default compatibility version reaches 1.37 and turns it on."""
_NANO: Final = 10**9
_MILLI_NANOS: Final = 10**6
_INT64_MAX: Final = 2**63 - 1


class AllocationError(Exception):
    """kube's Filter error for the claims: the pod's whole attempt fails (SchedulerError)."""


class NodeAllocationError(Exception):
    """kube's ``ErrFailedAllocationOnNode`` (1.35+): this node does not fit, for the reason
    given (Unschedulable there; the attempt goes on with the other nodes)."""


class _TimedOut(Exception):
    """The search ran past its deadline: the node does not fit (1.35: Unschedulable), or,
    from 1.36, the attempt fails as SchedulerError and retries after its backoff."""


class BudgetExhausted(Exception):
    """The attempt's device search budget (``stop_at``) ran out before this node's search
    ended, and before kube's own per-node timeout would have: no verdict for the node
    (:mod:`scheduler.core.dra.search` decides what the attempt then is)."""


TIMEOUT_IS_ERROR_FROM: Final = 36


class _TooMany(Exception):
    """A claim would get more than 32 results: backtrack further (not an error)."""


@dataclass(slots=True)
class Pool:
    driver: str
    name: str
    slices: list[ResourceSlice]
    """The device slices the node sees (slices with ``sharedCounters`` hold no devices)."""
    incomplete: bool = False
    invalid: bool = False
    others: list[ResourceSlice] = field(default_factory=list)
    """Device slices of the pool the node does not see: their allocated devices still
    consume the pool's counters (kube's ``DeviceSlicesNotTargetingNode``)."""
    counter_sets: dict[str, Counters] = field(default_factory=dict)
    """The pool's ``sharedCounters`` by set name, from whichever of its slices holds them."""

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.name}"


class SliceIndex:
    """All slices of the cluster, split by how they select nodes (built once per slice change)."""

    def __init__(self, slices: Iterable[ResourceSlice]) -> None:
        self.by_node: dict[str, list[ResourceSlice]] = {}
        self.all_nodes: list[ResourceSlice] = []
        self.selected: list[ResourceSlice] = []
        self.per_device: list[ResourceSlice] = []
        self.counter_slices: list[ResourceSlice] = []
        self.by_pool: dict[tuple[str, str], list[ResourceSlice]] = {}
        """Every slice of each (driver, pool), whatever node it targets (kube's
        ``checkSlicesInPool`` reads them when the node sees fewer than the pool's count)."""
        self._pools: dict[tuple[str, int], tuple[Labels, list[Pool]]] = {}
        self.tainted = False
        """Whether some device has a taint that can keep it from a request (only then is a
        failed allocation worth looking at for taints)."""
        for s in slices:
            self.tainted = self.tainted or any(d.blocking_taints for d in s.devices)
            self.by_pool.setdefault((s.driver, s.pool), []).append(s)
            if s.shared_counters:
                self.counter_slices.append(s)
            if s.node_name:
                self.by_node.setdefault(s.node_name, []).append(s)
            elif s.all_nodes:
                self.all_nodes.append(s)
            elif s.node_selector is not None:
                self.selected.append(s)
            elif s.per_device_node_selection:
                self.per_device.append(s)

    def device(self, device_id: DeviceId) -> Device | None:
        """The device as the newest generation of its pool publishes it (None: gone)."""
        members = self.by_pool.get((device_id.driver, device_id.pool), [])
        if not members:
            return None
        newest = max(s.generation for s in members)
        for s in members:
            if s.generation == newest:
                for d in s.devices:
                    if d.name == device_id.device:
                        return d
        return None

    def pools(self, node: str, labels: Labels, kube_minor: int = DEFAULT_KUBE_MINOR) -> list[Pool]:
        """The pools a node sees, newest generation per pool (cached per node: the index is
        rebuilt when a slice changes; labels matter only to selector slices)."""
        cached = self._pools.get((node, kube_minor))
        if cached is not None and (not (self.selected or self.per_device) or cached[0] is labels):
            return cached[1]
        pools = self._pools_of(node, labels, kube_minor)
        self._pools[(node, kube_minor)] = (labels, pools)
        return pools

    def _pools_of(self, node: str, labels: Labels, kube_minor: int) -> list[Pool]:
        """kube's ``GatherPools`` (dynamic-resource-allocation v0.36/v0.37 incubating)."""
        partitionable = kube_minor >= PARTITIONABLE_SINCE_MINOR
        visible: dict[str, ResourceSlice] = {}
        if partitionable and kube_minor == PARTITIONABLE_SINCE_MINOR:
            # v0.36: a slice with sharedCounters is relevant to every node.
            visible.update((s.name, s) for s in self.counter_slices)
        for s in (
            *self.by_node.get(node, ()),
            *self.all_nodes,
            *(
                s
                for s in self.selected
                if s.node_selector and s.node_selector.matches(labels, node)
            ),
            *(s for s in self.per_device if any(d.on_node(labels, node) for d in s.devices)),
        ):
            visible[s.name] = s
        grouped: dict[tuple[str, str], list[ResourceSlice]] = {}
        for s in visible.values():
            if not partitionable and s.per_device_node_selection:
                continue  # v0.35 (gate off) skips these; a counters-only slice still counts
            grouped.setdefault((s.driver, s.pool), []).append(s)
        pools: list[Pool] = []
        for (driver, name), members in sorted(grouped.items()):
            newest = max(s.generation for s in members)
            kept = sorted((s for s in members if s.generation == newest), key=lambda s: s.name)
            if len(kept) == kept[0].slice_count:
                pools.append(_build_pool(driver, name, kept, None, partitionable))
                continue
            everything = self.by_pool.get((driver, name), [])
            if any(s.generation > newest for s in everything):
                continue  # obsolete: the driver is replacing this generation
            same = [s for s in everything if s.generation == newest]
            if len(same) != kept[0].slice_count:
                pools.append(Pool(driver, name, kept, incomplete=True))
                continue
            pools.append(_build_pool(driver, name, kept, same, partitionable))
        if kube_minor >= BINDING_CONDITIONS_SINCE_MINOR:
            # kube tries the complete pools some of whose devices (on this node) have
            # binding conditions last, each group in pool order: a device that binds at
            # once is preferred to one whose binding waits for a driver.
            pools.sort(key=_waits_for_binding)
        return pools


def _waits_for_binding(pool: Pool) -> bool:
    """kube's ``poolHasBindingConditions`` (an incomplete pool stays in place)."""
    return not pool.incomplete and any(d.binding_conditions for s in pool.slices for d in s.devices)


def _build_pool(
    driver: str,
    name: str,
    kept: list[ResourceSlice],
    everything: list[ResourceSlice] | None,
    partitionable: bool,
) -> Pool:
    """kube's ``buildPool``: device slices, counter sets, and the pool invalid where device
    names repeat, a counter set name repeats, or a device consumes from a counter set (or a
    counter) the pool does not have."""
    counter_slices = [s for s in kept if partitionable and s.shared_counters]
    device_slices = [s for s in kept if not (partitionable and s.shared_counters)]
    others: list[ResourceSlice] = []
    if everything is not None and len(kept) < len(everything):
        seen = {s.name for s in kept}
        for s in everything:
            if s.name not in seen:
                (counter_slices if partitionable and s.shared_counters else others).append(s)
    names = [d.name for s in device_slices for d in s.devices]
    if len(names) != len(set(names)) or not partitionable:
        return Pool(driver, name, device_slices, invalid=len(names) != len(set(names)))
    sets: dict[str, Counters] = {}
    for s in counter_slices:
        for counter_set in s.shared_counters:
            if counter_set.name in sets:
                return Pool(driver, name, device_slices, invalid=True)
            sets[counter_set.name] = counter_set.counters
    for s in (*device_slices, *others):
        for d in s.devices:
            for use in d.consumes:
                have = sets.get(use.counter_set)
                if have is None or any(c not in have for c in use.counters):
                    return Pool(driver, name, device_slices, invalid=True)
    return Pool(driver, name, device_slices, others=others, counter_sets=sets)


@dataclass(frozen=True, slots=True)
class _Candidate:
    id: DeviceId
    device: Device
    slice: ResourceSlice
    pool: Pool


@dataclass(slots=True)
class _Request:
    """One request, or one subrequest of a firstAvailable request."""

    base: str
    """The request's name."""
    sub: str
    """The subrequest's name ('' for ``exactly``)."""
    spec: ExactRequest
    cls: DeviceClass
    count: int = 0
    all_devices: list[_Candidate] | None = None

    @property
    def result_name(self) -> str:
        return f"{self.base}/{self.sub}" if self.sub else self.base

    @property
    def admin(self) -> bool:
        return self.spec.admin_access is True


def _constrains(requests: frozenset[str], request: _Request) -> bool:
    """Whether a constraint naming ``requests`` (none: all) covers ``request``: by its own
    name, or a subrequest by ``request/sub``."""
    return (
        not requests
        or request.base in requests
        or (bool(request.sub) and request.result_name in requests)
    )


@dataclass(slots=True)
class _MatchAttribute:
    requests: frozenset[str]
    attribute: str
    value: Attribute | None = None
    members: int = 0

    def applies(self, request: _Request) -> bool:
        return _constrains(self.requests, request)

    def add(self, request: _Request, device: Device) -> bool:
        if not self.applies(request):
            return True
        value = device.attribute(self.attribute)
        if value is None:
            return False
        if self.members == 0:
            self.value = value
        elif value != self.value:
            return False
        self.members += 1
        return True

    def remove(self, request: _Request) -> None:
        if self.applies(request):
            self.members -= 1


@dataclass(slots=True)
class _DistinctAttribute:
    """kube's ``distinctAttributeConstraint``: every device of the named requests has the
    attribute, each with a value no other has (values of different types never clash)."""

    requests: frozenset[str]
    attribute: str
    values: list[Attribute] = field(default_factory=list)

    def applies(self, request: _Request) -> bool:
        return _constrains(self.requests, request)

    def add(self, request: _Request, device: Device) -> bool:
        if not self.applies(request):
            return True
        value = device.attribute(self.attribute)
        if value is None or value in self.values:
            return False
        self.values.append(value)
        return True

    def remove(self, request: _Request) -> None:
        if self.applies(request):
            self.values.pop()


_Constraint = _MatchAttribute | _DistinctAttribute


@dataclass(slots=True)
class _Picked:
    request: _Request
    candidate: _Candidate
    counters: bool = False
    """The device's counters were reserved for this pick (not for a later share)."""
    consumed: dict[str, int] | None = None
    """A share of a multi-allocatable device: the capacity it consumes."""


@dataclass(slots=True)
class _Search:
    claims: Sequence[ResourceClaim]
    requests: list[list[list[_Request]]]
    """Per claim, per request: the alternatives (one for ``exactly``)."""
    constraints: list[list[_Constraint]]
    pools: list[Pool]
    allocated: frozenset[DeviceId] | set[DeviceId]
    compiler: SelectorCompiler
    node: str
    labels: Labels = field(default_factory=dict)
    kube_minor: int = DEFAULT_KUBE_MINOR
    available: dict[object, dict[str, dict[str, int]]] = field(default_factory=dict)
    """Per pool: its counters minus what the cluster's allocated devices consume (kube's
    ``availableCounters``, computed on first use)."""
    consumed: dict[object, dict[str, dict[str, int]]] = field(default_factory=dict)
    """Per pool: the counters the devices picked in this search consume."""
    chosen_sub: dict[tuple[int, int], int] = field(default_factory=dict)
    picked: list[list[_Picked]] = field(default_factory=list)
    allocating: dict[DeviceId, set[int]] = field(default_factory=dict)
    memo: dict[tuple[DeviceId, int, int, int], bool] = field(default_factory=dict)
    deadline: float | None = None
    clock: Callable[[], float] = time.monotonic
    steps: int = 0
    aligned: bool = False
    order: dict[tuple[int, int, int], list[_Candidate | Pool]] = field(default_factory=dict)
    """Per (claim, request, subrequest): the devices in search order (an invalid pool
    stands at its place: reaching it is an error)."""
    ordered_with: dict[tuple[int, int, int], frozenset[DeviceId]] = field(default_factory=dict)
    """Per key of ``order`` (aligned searches): the devices this search's path held when
    the order was made (:func:`_held`)."""
    shared: Mapping[DeviceId, Mapping[str, int]] = field(default_factory=dict)
    """Capacity consumed by the shares of allocations written or assumed (kube's
    ``AggregatedCapacity``); a device with shares is a key even if they consume nothing."""
    allocating_capacity: dict[DeviceId, dict[str, int]] = field(default_factory=dict)
    """Capacity the shares picked in this search consume (kube's ``allocatingCapacity``)."""
    allocating_shares: dict[DeviceId, int] = field(default_factory=dict)
    """Shares picked in this search, per device."""


@dataclass(slots=True)
class AllocStats:
    """Time spent in :meth:`Allocator.allocate`, summed (for the allocation-time metric)."""

    seconds: float = 0.0
    calls: int = 0


class Allocator:
    """Per-cycle view: classes, slices and the devices already in use."""

    def __init__(
        self,
        *,
        classes: Mapping[str, DeviceClass],
        slices: SliceIndex,
        allocated: frozenset[DeviceId] | set[DeviceId],
        compiler: SelectorCompiler,
        timeout: float | None = FILTER_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
        aligned: bool = False,
        stats: AllocStats | None = None,
        compact_config: bool = True,
        kube_minor: int = DEFAULT_KUBE_MINOR,
        shared: Mapping[DeviceId, Mapping[str, int]] | None = None,
    ) -> None:
        if shared and kube_minor < CONSUMABLE_CAPACITY_SINCE_MINOR:
            # DRAConsumableCapacity off: kube counts a share's device as taken whole.
            allocated = frozenset(allocated) | frozenset(shared)
            shared = None
        self.shared: Mapping[DeviceId, Mapping[str, int]] = shared or {}
        """Capacity consumed by shares in use (:meth:`DraState.shared_capacity`)."""
        self.kube_minor = kube_minor
        """The release whose allocator this is (partitionable devices from 1.36)."""
        self.compact_config = compact_config
        """1.37's ``devices.config`` form (see :func:`_result`); False for 1.35-1.36's."""
        self.stats = stats
        self.classes = classes
        self.slices = slices
        self.allocated = allocated
        self.compiler = compiler
        self.timeout = timeout
        self.clock = clock
        self.aligned = aligned
        """Lattice's device order (see the module docstring, step 2); False: kube's."""

    def detached(self, clock: Callable[[], float] | None = None) -> Allocator:
        """The same view for a worker thread: the classes copied (the loop may change the
        live mapping meanwhile), no shared stats. The slice index and the devices in use
        are immutable already (a change builds new ones); the CEL compiler is shared.
        ``clock``: the search's (it reads +inf once the attempt is abandoned)."""
        return Allocator(
            classes=dict(self.classes),
            slices=self.slices,
            allocated=frozenset(self.allocated),
            compiler=self.compiler,
            timeout=self.timeout,
            clock=clock or self.clock,
            aligned=self.aligned,
            compact_config=self.compact_config,
            kube_minor=self.kube_minor,
            shared=self.shared,
        )

    def allocate(
        self,
        node: str,
        labels: Labels,
        claims: Sequence[ResourceClaim],
        *,
        stop_at: float | None = None,
    ) -> list[dict[str, Any]] | None:
        """Allocations for ``claims`` on ``node`` (one per claim), or None when they do not
        fit; raises :class:`AllocationError` as described in the module docstring.
        ``stop_at`` (this allocator's clock): the attempt's budget; a search still running
        then raises :class:`BudgetExhausted`, unless kube's own timeout came first."""
        if self.stats is None:
            return self._allocate(node, labels, claims, stop_at)
        started = time.perf_counter()
        try:
            return self._allocate(node, labels, claims, stop_at)
        finally:
            self.stats.seconds += time.perf_counter() - started
            self.stats.calls += 1

    def _allocate(
        self,
        node: str,
        labels: Labels,
        claims: Sequence[ResourceClaim],
        stop_at: float | None,
    ) -> list[dict[str, Any]] | None:
        pools = self.slices.pools(node, labels, self.kube_minor)
        own = None if self.timeout is None else self.clock() + self.timeout
        budgeted = stop_at is not None and (own is None or stop_at < own)
        deadline = stop_at if budgeted else own
        search = _Search(
            claims=claims,
            requests=[],
            constraints=[],
            pools=pools,
            allocated=self.allocated,
            compiler=self.compiler,
            node=node,
            labels=labels,
            kube_minor=self.kube_minor,
            deadline=deadline,
            clock=self.clock,
            aligned=self.aligned,
            shared=self.shared,
        )
        for ci, claim in enumerate(claims):
            per_request: list[list[_Request]] = []
            minimum = 0
            for ri, request in enumerate(claim.requests):
                if request.exactly is not None:
                    alternatives = [(request.exactly, "")]
                elif request.first_available:
                    alternatives = [(s, s.name) for s in request.first_available]
                else:
                    raise AllocationError(
                        f"claim {_ref(claim)}, request {request.name}: unknown request type"
                    )
                built = [
                    self._validate(search, claim, ci, ri, si, request.name, sub, spec)
                    for si, (spec, sub) in enumerate(alternatives)
                ]
                per_request.append(built)
                minimum += min(r.count for r in built)
            if minimum > RESULTS_MAX:
                raise AllocationError(
                    f"claim {_ref(claim)}: number of requested devices {minimum} exceeds the "
                    f"claim limit of {RESULTS_MAX}"
                )
            search.requests.append(per_request)
            constraints: list[_Constraint] = []
            for i, c in enumerate(claim.constraints):
                if c.match_attribute is not None:
                    constraints.append(_MatchAttribute(frozenset(c.requests), c.match_attribute))
                elif c.distinct_attribute is not None and _consumable(search):
                    constraints.append(
                        _DistinctAttribute(frozenset(c.requests), c.distinct_attribute)
                    )
                else:
                    raise AllocationError(
                        f"claim {_ref(claim)}, constraint #{i}: empty constraint "
                        "(unsupported constraint type?)"
                    )
            search.constraints.append(constraints)
            search.picked.append([])
        if _short_of_devices(search):
            return None
        try:
            done = _allocate_one(search, 0, 0, 0, 0, in_sub=False)
        except _TooMany:
            done = False
        except _TimedOut:
            if budgeted:
                raise BudgetExhausted(node) from None
            if self.kube_minor >= TIMEOUT_IS_ERROR_FROM:
                raise AllocationError(
                    f"node {node}: timed out trying to allocate devices"
                ) from None
            raise NodeAllocationError("timed out trying to allocate devices") from None
        if not done:
            if any(pool.invalid for pool in search.pools):
                raise NodeAllocationError("invalid resource pools were encountered")
            return None
        return [_result(search, ci, self.compact_config) for ci in range(len(claims))]

    def any_in_use(self, node: str, labels: Labels) -> bool:
        """Whether some device of the node's pools is in a written or assumed allocation
        (only then can evicting a pod free one)."""
        allocated = self.allocated
        shared = self.shared
        if not allocated and not shared:
            return False
        return any(
            (device_id := DeviceId(s.driver, s.pool, d.name)) in allocated or device_id in shared
            for pool in self.slices.pools(node, labels, self.kube_minor)
            for s in pool.slices
            for d in s.devices
        )

    def _validate(
        self,
        search: _Search,
        claim: ResourceClaim,
        ci: int,
        ri: int,
        si: int,
        base: str,
        sub: str,
        spec: ExactRequest,
    ) -> _Request:
        label = (
            f"claim {_ref(claim)}, request {base}/{sub}"
            if sub
            else f"claim {_ref(claim)}, request {base}"
        )
        for i, expression in enumerate(spec.selectors):
            if expression is None:
                raise AllocationError(
                    f"{label}, selector #{i}: CEL expression empty (unsupported selector type?)"
                )
        if not spec.device_class:
            raise AllocationError(f"{label}: missing device class name")
        cls = self.classes.get(spec.device_class)
        if cls is None:
            raise AllocationError(f"{label}: could not retrieve device class {spec.device_class}")
        request = _Request(base, sub, spec, cls)
        if spec.mode == EXACT_COUNT:
            request.count = spec.count
        elif spec.mode == ALL:
            devices: list[_Candidate] = []
            for pool in search.pools:
                if pool.incomplete:
                    raise AllocationError(
                        f"{label}: asks for all devices, but resource pool {pool.id} is "
                        "currently being updated"
                    )
                if pool.invalid:
                    raise AllocationError(
                        f"{label}: asks for all devices, but resource pool {pool.id} is "
                        "currently invalid"
                    )
                for s in pool.slices:
                    for d in s.devices:
                        device_id = DeviceId(s.driver, s.pool, d.name)
                        if not _selectable(search, request, (ci, ri, si), claim, device_id, d, s):
                            continue
                        if _consumable(search) and not _fits_capacity(
                            search, request, claim, device_id, d, static=True
                        ):
                            continue  # kube: static capacity only, before the search
                        devices.append(_Candidate(device_id, d, s, pool))
            request.all_devices = devices
            request.count = len(devices)
        else:
            raise AllocationError(f"{label}: unsupported count mode {spec.mode}")
        return request


@dataclass(frozen=True, slots=True)
class RequestView:
    """For ``lattice explain``: one claim request (or firstAvailable subrequest) on a node."""

    claim: str
    request: str
    needed: int | None
    """Devices asked (None: ``allocationMode: All``)."""
    matching: int
    """Devices of the node's pools that the class and request selectors accept."""
    free: int
    """Of those, the ones in no written or assumed allocation and with no taint the
    request does not tolerate."""
    error: str = ""
    """A selector's CEL runtime error or a missing class (the attempt fails with it)."""
    tainted: int = 0
    """Matching devices in no allocation that a taint keeps from the request."""
    taints: tuple[str, ...] = ()
    """Those devices' untolerated taints (``key=value:Effect``), each once, as first seen."""

    @property
    def short_by_taints(self) -> bool:
        """Taints make the difference: an All request reaches a tainted device (kube then
        fails it), or an ExactCount one has too few free devices but would have enough
        with the tainted ones."""
        if self.error or not self.tainted:
            return False
        if self.needed is None:
            return True
        return self.free < self.needed <= self.free + self.tainted


def diagnose(
    allocator: Allocator, node: str, labels: Labels, claims: Sequence[ResourceClaim]
) -> list[RequestView]:
    """Per request of each claim: how many of the node's devices match and are free, so
    an operator sees which request cannot be met (a constraint is the reason when every
    request has enough free devices and the node still does not fit)."""
    return [v for alternatives in _views(allocator, node, labels, claims) for v in alternatives]


def untolerated_taints(
    allocator: Allocator, node: str, labels: Labels, claims: Sequence[ResourceClaim]
) -> tuple[str, ...]:
    """The device taints that keep some request of ``claims`` from the node: a request all
    of whose alternatives fall short, some because of taints (:attr:`RequestView.
    short_by_taints`). Empty where taints are not the reason; nothing is evaluated where no
    device of the cluster carries a blocking taint."""
    if not allocator.slices.tainted:
        return ()
    named: dict[str, None] = {}
    for alternatives in _views(allocator, node, labels, claims):
        if all(_short(v) for v in alternatives):
            for view in alternatives:
                if view.short_by_taints:
                    named.update(dict.fromkeys(view.taints))
    return tuple(named)


def _short(view: RequestView) -> bool:
    if view.error:
        return False
    if view.needed is None:
        return view.tainted > 0
    return view.free < view.needed


def _views(
    allocator: Allocator, node: str, labels: Labels, claims: Sequence[ResourceClaim]
) -> list[list[RequestView]]:
    """Per request of each claim, a view per alternative (one for ``exactly``)."""
    pools = allocator.slices.pools(node, labels, allocator.kube_minor)
    search = _Search(
        claims=claims,
        requests=[],
        constraints=[],
        pools=pools,
        allocated=allocator.allocated,
        compiler=allocator.compiler,
        node=node,
        labels=labels,
        kube_minor=allocator.kube_minor,
    )
    out: list[list[RequestView]] = []
    for claim in claims:
        for request in claim.requests:
            alternatives = (
                [(request.exactly, request.name)]
                if request.exactly is not None
                else [(sub, f"{request.name}/{sub.name}") for sub in request.first_available]
            )
            out.append(
                [
                    _view(search, allocator, claim, spec, label, pools)
                    for spec, label in alternatives
                ]
            )
    return out


def _view(
    search: _Search,
    allocator: Allocator,
    claim: ResourceClaim,
    spec: ExactRequest,
    label: str,
    pools: Sequence[Pool],
) -> RequestView:
    needed = spec.count if spec.mode == EXACT_COUNT else None
    cls = allocator.classes.get(spec.device_class)
    if cls is None:
        return RequestView(_ref(claim), label, needed, 0, 0, f"no device class {spec.device_class}")
    matching = free = tainted = 0
    error = ""
    taints: dict[str, None] = {}
    for pool in pools:
        for s in pool.slices:
            for d in s.devices:
                if not d.allocatable(search.kube_minor) or _gated(search, d):
                    continue
                try:
                    ok = _selectors_match(
                        search, d, cls.selectors, f"class {cls.name}"
                    ) and _selectors_match(search, d, spec.selectors, _ref(claim))
                except AllocationError as err:
                    error = error or str(err)
                    continue
                if not ok or (
                    s.per_device_node_selection and not d.on_node(search.labels, search.node)
                ):
                    continue
                matching += 1
                if spec.admin_access is not True and (
                    DeviceId(s.driver, s.pool, d.name) in allocator.allocated
                ):
                    continue
                blocking = untolerated(d.taints, spec.tolerations) if d.taints else []
                if blocking:
                    tainted += 1
                    taints.update(dict.fromkeys(str(t) for t in blocking))
                else:
                    free += 1
    return RequestView(_ref(claim), label, needed, matching, free, error, tainted, tuple(taints))


def _ref(claim: ResourceClaim) -> str:
    return f"{claim.namespace}/{claim.name}" if claim.namespace else claim.name


def _short_of_devices(search: _Search) -> bool:
    """Whether the node's free devices cannot serve the requests' counts, alone or
    together: some ExactCount request has fewer free devices its selectors accept than it
    asks for, or some set of requests accepts fewer distinct free devices than they ask for
    between them (Hall's condition: 16 + 2 on a node of 16, 9 + 9 on 16). Then no
    allocation exists, and the search would learn it only by walking the subsets (or, on
    1.35, the orders) of the node's devices: in Go kube walks 16 + 2 in milliseconds, in
    Python it took longer than the attempt's 10 s budget under CI load. kube's verdict is
    that the node does not fit, or, where its own walk is long, its 10 s time-out.

    Only where the search can end in nothing but fit, no fit or time-out, so kube's verdict
    is kept exactly: every request a plain ExactCount one (no firstAvailable, All or
    adminAccess, whose searches can raise errors of their own), no invalid pool, and no
    selector failing at runtime on any free device (kube's search may reach it first). A
    device tainted against the request is not free for it (its selectors still run: kube
    evaluates them before the taint). Counters, matchAttribute constraints and the 32
    results of a claim only narrow what can be allocated, so a shortfall here is one there.
    A device allowing multiple allocations (1.36+) can serve several requests: no shortcut."""
    if any(pool.invalid for pool in search.pools):
        return False
    requests = [
        (ci, ri, alternatives[0])
        for ci, per_request in enumerate(search.requests)
        for ri, alternatives in enumerate(per_request)
    ]
    if any(
        len(search.requests[ci][ri]) != 1 or r.sub or r.admin or r.all_devices is not None
        for ci, ri, r in requests
    ):
        return False
    accepted: list[frozenset[DeviceId]] = []
    for ci, ri, request in requests:
        claim = search.claims[ci]
        free: set[DeviceId] = set()
        for pool in search.pools:
            for s in pool.slices:
                for d in s.devices:
                    device_id = DeviceId(s.driver, s.pool, d.name)
                    if device_id in search.allocated:
                        continue
                    try:
                        selectable = _selectable(
                            search, request, (ci, ri, 0), claim, device_id, d, s
                        )
                    except AllocationError:
                        return False
                    if selectable and not _gated(search, d) and not _blocked(request, d):
                        if d.multiple:
                            return False  # one device may serve several requests
                        free.add(device_id)
        accepted.append(frozenset(free))
    counts = [request.count for _, _, request in requests]
    return _hall_violated(counts, accepted)


HALL_MAX_REQUESTS: Final = 12
"""Requests up to which every subset is checked (4096 unions); past it, each request
alone and all of them together."""


def _hall_violated(counts: Sequence[int], accepted: Sequence[frozenset[DeviceId]]) -> bool:
    """Whether no assignment gives request ``i`` ``counts[i]`` devices of ``accepted[i]``,
    no device twice: some set of requests asks more than the union of what it accepts.
    Every set is tried up to :data:`HALL_MAX_REQUESTS` requests (exact: Hall's theorem,
    a request standing for ``count`` copies of itself); beyond, only singles and the whole
    (a weaker test, still never a false shortfall)."""
    n = len(counts)
    if any(len(a) < c for a, c in zip(accepted, counts, strict=True)):
        return True
    if n < 2:
        return False
    if n > HALL_MAX_REQUESTS:
        return len(frozenset().union(*accepted)) < sum(counts)
    for mask in range(3, 1 << n):
        if mask & (mask - 1) == 0:
            continue  # singles are checked above
        members = [i for i in range(n) if mask >> i & 1]
        union: set[DeviceId] = set()
        for i in members:
            union |= accepted[i]
        if len(union) < sum(counts[i] for i in members):
            return True
    return False


def _selectable(
    search: _Search,
    request: _Request,
    key: tuple[int, int, int],
    claim: ResourceClaim,
    device_id: DeviceId,
    device: Device,
    resource_slice: ResourceSlice,
) -> bool:
    """kube's ``isSelectable``: class selectors, request selectors, then (a slice with
    ``perDeviceNodeSelection``) the device's own node selection."""
    if not device.allocatable(search.kube_minor):
        return False
    memo_key = (device_id, *key)
    cached = search.memo.get(memo_key)
    if cached is not None:
        return cached
    verdict = _selectors_match(search, device, request.cls.selectors, f"class {request.cls.name}")
    if verdict:
        verdict = _selectors_match(search, device, request.spec.selectors, f"claim {_ref(claim)}")
    if verdict and resource_slice.per_device_node_selection:
        verdict = device.on_node(search.labels, search.node)
    search.memo[memo_key] = verdict
    return verdict


def _partitionable(search: _Search) -> bool:
    return search.kube_minor >= PARTITIONABLE_SINCE_MINOR


def _gated(search: _Search, device: Device) -> bool:
    """A device kube's allocator passes over while DRAPartitionableDevices is off (1.35):
    one that consumes counters. One with a node of its own is passed over too (an API
    server with the gate off drops the field; one with it on must not get a misplaced
    device from Lattice)."""
    if not _consumable(search) and device.multiple:
        return True  # 1.35: Lattice hands out no device meant for sharing
    return not _partitionable(search) and bool(device.consumes or device.own_node_selection)


def _consumable(search: _Search) -> bool:
    return search.kube_minor >= CONSUMABLE_CAPACITY_SINCE_MINOR


class _NotRepresentable(Exception):
    """kube's ``errCapacityRequestNotRepresentable``: the attempt fails."""


def _units(nanos: int, unit: int) -> int:
    """``Value()`` (unit 1) or ``MilliValue()`` (unit 1m): rounded up."""
    return -((-nanos) // unit)


def _milli_range(policy: RequestPolicy, search: _Search) -> bool:
    """kube's ``useMilli`` (with DRAFractionalCapacityRange on): every bound a whole number
    of milliunits, the step at least 1m."""
    if search.kube_minor < FRACTIONAL_RANGE_SINCE_MINOR:
        return False
    bounds = [b for b in (policy.min, policy.max, policy.step) if b is not None]
    if any(b % _MILLI_NANOS for b in bounds):
        return False
    return policy.step is None or policy.step >= _MILLI_NANOS


def _round_up(requested: int, policy: RequestPolicy, search: _Search) -> int:
    """kube's ``calculateConsumedCapacity`` for a request under a policy, nanounits."""
    if policy.has_range and policy.min is not None:
        if requested < policy.min:
            return policy.min
        if policy.step is None:
            return requested
        unit = _MILLI_NANOS if _milli_range(policy, search) else _NANO
        if unit == _MILLI_NANOS and requested % _MILLI_NANOS:
            raise _NotRepresentable(f"request {Quantity(requested)} is not a milli value")
        if unit == _NANO and requested > _INT64_MAX * _NANO:
            raise _NotRepresentable(f"request {Quantity(requested)} exceeds MaxInt64")
        req, step, low = (_units(v, unit) for v in (requested, policy.step, policy.min))
        n = -((low - req) // step)
        if low >= 0 and n > (_INT64_MAX - low) // step:
            raise _NotRepresentable(f"rounding request {Quantity(requested)} passes MaxInt64")
        return (low + step * n) * unit
    if policy.valid_values:
        return next((v for v in policy.valid_values if requested <= v), requested)
    return requested


def _violates(consumed: int, policy: RequestPolicy, search: _Search) -> bool:
    """kube's ``violatesPolicy``: the default is always valid; else above ``max``, off the
    step's grid, or not one of ``validValues``."""
    if policy.default is not None and consumed == policy.default:
        return False
    if policy.has_range:
        if policy.max is not None and consumed > policy.max:
            return True
        if policy.step is not None and policy.min is not None:
            unit = _MILLI_NANOS if _milli_range(policy, search) else _NANO
            if unit == _MILLI_NANOS and consumed % _MILLI_NANOS:
                return True
            step, low = _units(policy.step, unit), _units(policy.min, unit)
            return (_units(consumed, unit) - low) % step != 0
        return False
    if policy.valid_values:
        return consumed not in policy.valid_values
    return False


def _consumed_capacity(
    request: _Request, claim: ResourceClaim, device_id: DeviceId, device: Device, search: _Search
) -> dict[str, int]:
    """What one share of ``device`` consumes for ``request``, per capacity of the device
    (kube's ``GetConsumedCapacityFromRequest``): the request rounded up by the policy; an
    omitted request the policy's default, else the whole capacity. Raises
    :class:`AllocationError` for a request that cannot be represented or a negative result."""
    asked = dict(request.spec.capacity or ())
    out: dict[str, int] = {}
    for name, capacity in sorted(device.capacity.items()):
        policy = device.policies.get(name)
        requested = asked.get(name)
        try:
            if requested is None:
                value = (
                    policy.default
                    if policy is not None and policy.default is not None
                    else capacity.nanos
                )
            elif policy is None:
                value = requested
            else:
                value = _round_up(requested, policy, search)
            if value < 0:
                raise _NotRepresentable("capacity value is negative")
        except _NotRepresentable as err:
            raise AllocationError(
                f"claim {_ref(claim)}, request {request.result_name}: checking capacity for "
                f"device {device_id.driver}/{device_id.pool}/{device_id.device}: capacity "
                f'"{name}": {err}'
            ) from None
        out[name] = value
    return out


def _fits_capacity(
    search: _Search,
    request: _Request,
    claim: ResourceClaim,
    device_id: DeviceId,
    device: Device,
    *,
    static: bool = False,
) -> bool:
    """kube's ``CmpRequestOverCapacity``: the device has every capacity the request names,
    and each capacity holds what the shares in use, those picked in this search and this
    request consume (``static``: this request alone); a consumption the policy does not
    allow refuses the device. Devices that allow one allocation are checked too (their
    capacity is then a bound on the request)."""
    asked = request.spec.capacity
    if asked and any(name not in device.capacity for name, _ in asked):
        return False
    consumed = _consumed_capacity(request, claim, device_id, device, search)
    in_use: Mapping[str, int] = {} if static else search.shared.get(device_id, {})
    allocating: Mapping[str, int] = {} if static else search.allocating_capacity.get(device_id, {})
    for name, capacity in device.capacity.items():
        value = consumed[name]
        policy = device.policies.get(name)
        if policy is not None and _violates(value, policy, search):
            return False
        if in_use.get(name, 0) + value + allocating.get(name, 0) > capacity.nanos:
            return False
    return True


def _pool_key(search: _Search, pool: Pool) -> object:
    """v0.36 keyed its counter caches by pool name only (fixed in v0.37: driver and pool)."""
    if search.kube_minor == PARTITIONABLE_SINCE_MINOR:
        return pool.name
    return (pool.driver, pool.name)


def _count(consumed: dict[str, dict[str, int]], device: Device, sign: int) -> None:
    for use in device.consumes:
        counters = consumed.setdefault(use.counter_set, {})
        for name, value in use.counters.items():
            counters[name] = counters.get(name, 0) + sign * value


def _reserve_counters(search: _Search, c: _Candidate) -> bool:
    """kube's ``checkAvailableCounters``: add the device's consumption to the search's,
    then every counter of the pool must still cover what the search consumes of it
    (kube checks them all, not only the device's: a counter over-spent by allocated
    devices refuses every consuming device of the pool). Undone on refusal."""
    key = _pool_key(search, c.pool)
    available = search.available.get(key)
    if available is None:
        available = {n: dict(counters) for n, counters in c.pool.counter_sets.items()}
        for s in (*c.pool.slices, *c.pool.others):
            for d in s.devices:
                if not d.consumes or DeviceId(s.driver, s.pool, d.name) not in search.allocated:
                    continue
                for use in d.consumes:
                    left = available.get(use.counter_set)
                    if left is None:
                        continue
                    for name, value in use.counters.items():
                        if name in left:
                            left[name] -= value  # may go negative: nothing left
        search.available[key] = available
    consumed = search.consumed.setdefault(key, {})
    _count(consumed, c.device, 1)
    for set_name, counters in available.items():
        used = consumed.get(set_name, {})
        for name, value in counters.items():
            if value < used.get(name, 0):
                _count(consumed, c.device, -1)
                return False
    return True


def _release_counters(search: _Search, c: _Candidate) -> None:
    _count(search.consumed[_pool_key(search, c.pool)], c.device, -1)


def _reserves(search: _Search, c: _Candidate) -> bool:
    return bool(c.device.consumes) and _partitionable(search)


def _selectors_match(
    search: _Search, device: Device, selectors: Sequence[str | None], owner: str
) -> bool:
    for i, expression in enumerate(selectors):
        if expression is None:
            raise AllocationError(f"{owner}: selector #{i}: not a CEL selector")
        try:
            if not device.matches(expression, search.compiler):
                return False
        except CelError as err:
            raise AllocationError(f"{owner}: selector #{i}: CEL runtime error: {err}") from err
    return True


def _in_use(search: _Search, request: _Request, ci: int, device_id: DeviceId) -> bool:
    if request.admin:
        return ci in search.allocating.get(device_id, ())
    return device_id in search.allocated or bool(search.allocating.get(device_id))


def _blocked(request: _Request, device: Device) -> bool:
    """kube's ``taintPreventsAllocation``: some NoSchedule or NoExecute taint of the device
    that none of the request's tolerations matches."""
    return bool(device.taints) and bool(untolerated(device.taints, request.spec.tolerations))


def _take(search: _Search, ci: int, request: _Request, c: _Candidate, *, must: bool) -> bool:
    """kube's ``allocateDevice``: in use, the partitionable gate, counters (once per
    multi-allocatable device: a further share does not charge them again), taints, the
    claim's constraints, then (1.36+) the capacity; a refusal undoes what was reserved."""
    if _in_use(search, request, ci, c.id):
        return False
    if _gated(search, c.device):
        return False
    multiple = c.device.multiple and _consumable(search)
    reserved = _reserves(search, c) and not (
        multiple and (c.id in search.shared or search.allocating_shares.get(c.id, 0) > 0)
    )
    if reserved and not _reserve_counters(search, c):
        return False
    if _blocked(request, c.device):
        if reserved:
            _release_counters(search, c)
        return False  # even with ``must`` (All): unsatisfiable, not an error
    constraints = search.constraints[ci]
    for i, constraint in enumerate(constraints):
        if not constraint.add(request, c.device):
            if reserved:
                _release_counters(search, c)
            if must:
                raise AllocationError(
                    f"claim {_ref(search.claims[ci])}, request {request.result_name}: cannot add "
                    f"device {c.id.driver}/{c.id.pool}/{c.id.device} because a claim constraint "
                    "would not be satisfied"
                )
            for earlier in constraints[:i]:
                earlier.remove(request)
            return False
    consumed: dict[str, int] | None = None
    if _consumable(search):
        if not _fits_capacity(search, request, search.claims[ci], c.id, c.device):
            for constraint in constraints:
                constraint.remove(request)
            if reserved:
                _release_counters(search, c)
            return False
        if multiple:
            consumed = _consumed_capacity(request, search.claims[ci], c.id, c.device, search)
            allocating = search.allocating_capacity.setdefault(c.id, {})
            for name, value in consumed.items():
                allocating[name] = allocating.get(name, 0) + value
            search.allocating_shares[c.id] = search.allocating_shares.get(c.id, 0) + 1
    if not multiple:
        search.allocating.setdefault(c.id, set()).add(ci)
    search.picked[ci].append(_Picked(request, c, reserved, consumed))
    return True


def _release(search: _Search, ci: int, request: _Request, c: _Candidate) -> None:
    picked = search.picked[ci].pop()
    for constraint in search.constraints[ci]:
        constraint.remove(request)
    if picked.counters:
        _release_counters(search, c)
    if picked.consumed is not None:
        allocating = search.allocating_capacity[c.id]
        for name, value in picked.consumed.items():
            allocating[name] -= value
        left = search.allocating_shares[c.id] - 1
        if left:
            search.allocating_shares[c.id] = left
        else:
            del search.allocating_shares[c.id]
            del search.allocating_capacity[c.id]
    else:
        search.allocating[c.id].discard(ci)


COMBINATIONS_FROM: Final = 36
"""From v0.36 kube's allocator (incubating) tries each request's next device only after the
one just taken (``startLocation``): subsets, not orderings, so a request that cannot be met
fails after 2^n steps instead of n!. The first allocation found is the same."""


def _allocate_one(
    search: _Search, ci: int, ri: int, si: int, di: int, *, in_sub: bool, start: int = 0
) -> bool:
    if ci >= len(search.claims):
        return True
    search.steps += 1
    if (
        search.deadline is not None
        and search.steps % _CLOCK_EVERY == 0
        and search.clock() > search.deadline
    ):
        raise _TimedOut
    claim_requests = search.requests[ci]
    if ri >= len(claim_requests):
        try:
            return _allocate_one(search, ci + 1, 0, 0, 0, in_sub=False)
        except _TooMany:
            return False
    alternatives = claim_requests[ri]
    if not in_sub and alternatives[0].sub:
        all_too_many = True
        for index in range(len(alternatives)):
            try:
                done = _allocate_one(search, ci, ri, index, 0, in_sub=True)
            except _TooMany:
                continue
            all_too_many = False
            if done:
                search.chosen_sub[(ci, ri)] = index
                return True
        if all_too_many:
            raise _TooMany
        return False
    request = alternatives[si]
    if request.all_devices is not None and not request.all_devices:
        return False
    if di >= request.count:
        return _allocate_one(search, ci, ri + 1, 0, 0, in_sub=False)
    if len(search.picked[ci]) + request.count - di > RESULTS_MAX:
        raise _TooMany
    if request.all_devices is not None:
        c = request.all_devices[di]
        if not _take(search, ci, request, c, must=True):
            return False
        try:
            done = _allocate_one(search, ci, ri, si, di + 1, in_sub=in_sub)
        except BaseException:
            _release(search, ci, request, c)
            raise
        if not done:
            _release(search, ci, request, c)
        return done
    claim = search.claims[ci]
    key = (ci, ri, si)
    candidates = search.order.get(key)
    stale = di == 0 and key in search.ordered_with and search.ordered_with[key] != _held(search)
    if candidates is None or stale:
        # The root-aware order counts what the earlier claims and requests of this path
        # hold: a path that backtracked to other devices orders the request anew. Within
        # one request (di > 0) the order stays, as ``start`` indexes into it.
        candidates = search.order[key] = _ordered(search, request, key, claim)
        if search.aligned and not request.admin and _reorderable(claim):
            search.ordered_with[key] = _held(search)
    if search.kube_minor < COMBINATIONS_FROM:
        start = 0
    for index in range(start, len(candidates)):
        entry = candidates[index]
        if isinstance(entry, Pool):
            raise AllocationError(f"pool {entry.id} is invalid (duplicate device names)")
        if _in_use(search, request, ci, entry.id):
            continue
        if not _selectable(search, request, key, claim, entry.id, entry.device, entry.slice):
            continue
        if _consumable(search) and not _fits_capacity(
            search, request, claim, entry.id, entry.device
        ):
            continue
        if not _take(search, ci, request, entry, must=False):
            continue
        try:
            done = _allocate_one(search, ci, ri, si, di + 1, in_sub=in_sub, start=index + 1)
        except BaseException:
            _release(search, ci, request, entry)
            raise
        if done:
            return True
        _release(search, ci, request, entry)
    return False


def _ordered(
    search: _Search, request: _Request, key: tuple[int, int, int], claim: ResourceClaim
) -> list[_Candidate | Pool]:
    """The devices an ExactCount request tries, pool by pool: kube's order (slices by name,
    ``spec.devices`` order) unless ``search.aligned`` and the pool's devices sit on two or
    more PCIe roots (:func:`_by_root`) and the claim is :func:`_reorderable`. Kube's order
    stays where the request has adminAccess (it may reuse devices in use) or a selector
    fails with an error on some free device of the pool: which device kube reaches first
    then decides the verdict."""
    out: list[_Candidate | Pool] = []
    for pool in search.pools:
        if pool.invalid or pool.incomplete:
            # kube 1.35+ takes no device from either and goes on to the next pool; a node
            # that then does not fit says so if it saw an invalid pool (NodeAllocationError).
            continue
        devices = [
            _Candidate(DeviceId(s.driver, s.pool, d.name), d, s, pool)
            for s in pool.slices
            for d in s.devices
        ]
        if search.aligned and not request.admin and len(devices) > 1 and _reorderable(claim):
            devices = _by_root(search, request, key, claim, devices)
        out += devices
    return out


def _held(search: _Search) -> frozenset[DeviceId]:
    """The devices picked so far on this search's path (earlier claims and requests)."""
    return frozenset(d for d, holders in search.allocating.items() if holders)


def _reorderable(claim: ResourceClaim) -> bool:
    """Claims the root-aware order provably spans no more roots than any order: one
    request and no constraint, or every request under one pcieRoot ``matchAttribute``
    (which pins them to one root anyway). Elsewhere (several free requests, constraints on
    other attributes) the first solution in another order could span more: kube's order."""
    if not claim.constraints:
        return len(claim.requests) == 1
    names = {r.name for r in claim.requests}
    return any(
        c.match_attribute == PCIE_ROOT and (not c.requests or set(c.requests) >= names)
        for c in claim.constraints
    )


def _by_root(
    search: _Search,
    request: _Request,
    key: tuple[int, int, int],
    claim: ResourceClaim,
    devices: list[_Candidate],
) -> list[_Candidate]:
    """Whole roots first that hold the request's count of free selectable devices, fewest
    first (best fit: a 1-device claim fills a partly used root, a pair lands on one root);
    then the roots that hold fewer, most first (fewest roots spanned); kube's order inside a
    root and between equal ones. Free: in no allocation and not picked on this path by an
    earlier claim or request (seed 1257856956's c14: a 1-device claim took one of a pair,
    and counting it free sent the next claim's pair across two roots)."""
    roots = [c.device.attribute(PCIE_ROOT) for c in devices]
    if len({r for r in roots if r is not None}) < 2:
        return devices
    need = request.count
    free: dict[Attribute | None, int] = {}
    first: dict[Attribute | None, int] = {}
    for i, (c, root) in enumerate(zip(devices, roots, strict=True)):
        first.setdefault(root, i)
        if _in_use(search, request, key[0], c.id):
            continue
        try:
            usable = _selectable(search, request, key, claim, c.id, c.device, c.slice)
        except AllocationError:
            return devices
        if usable and not _gated(search, c.device) and not _blocked(request, c.device):
            free[root] = free.get(root, 0) + 1

    def rank(i: int) -> tuple[bool, int, int, int]:
        n = free.get(roots[i], 0)
        return (n < need, n if n >= need else -n, first[roots[i]], i)

    return [devices[i] for i in sorted(range(len(devices)), key=rank)]


def _result(search: _Search, ci: int, compact: bool) -> dict[str, Any]:
    """The claim's ``status.allocation``. ``compact`` is dynamic-resource-allocation v0.37's
    form: a claim config naming requests goes in once (earlier releases add one copy per
    matching request), and a config that applies to every request of the claim (its name,
    or a firstAvailable request's chosen ``req/sub``) drops ``requests`` ("empty means all")."""
    claim = search.claims[ci]
    results: list[dict[str, Any]] = []
    for p in search.picked[ci]:
        entry: dict[str, Any] = {
            "request": p.request.result_name,
            "driver": p.candidate.id.driver,
            "pool": p.candidate.id.pool,
            "device": p.candidate.id.device,
        }
        if p.request.admin:
            entry["adminAccess"] = True
        if p.request.spec.tolerations:
            entry["tolerations"] = [t.to_api() for t in p.request.spec.tolerations]
        if p.consumed is not None:
            entry["shareID"] = str(uuid.uuid4())  # kube: a random (v4) UUID per share
            if p.consumed:
                entry["consumedCapacity"] = {
                    name: str(Quantity(value)) for name, value in sorted(p.consumed.items())
                }
        device = p.candidate.device
        if device.binding_conditions:  # allocatable from 1.36 only: kube copies them then
            entry["bindingConditions"] = list(device.binding_conditions)
        if device.binding_failure_conditions:
            entry["bindingFailureConditions"] = list(device.binding_failure_conditions)
        results.append(entry)
    config: list[dict[str, Any]] = []
    class_ranges: dict[str, tuple[int, int]] = {}
    used: list[_Request] = []
    for ri, alternatives in enumerate(search.requests[ci]):
        request = alternatives[search.chosen_sub.get((ci, ri), 0)]
        used.append(request)
        span = class_ranges.get(request.cls.name)
        if span is not None:
            for i in range(*span):
                config[i]["requests"].append(request.result_name)
            continue
        start = len(config)
        for entry_body in request.cls.config:
            config.append(
                {
                    "source": FROM_CLASS,
                    "requests": [request.result_name],
                    **{k: v for k, v in entry_body.items() if k != "requests"},
                }
            )
        class_ranges[request.cls.name] = (start, len(config))
    for claim_config in claim.config:
        body = {k: v for k, v in claim_config.body.items() if k != "requests"}
        entry = {"source": FROM_CLAIM}
        if claim_config.requests:
            entry["requests"] = list(claim_config.requests)
        entry.update(body)
        if not claim_config.requests:
            config.append(dict(entry))
            continue
        for request in used:
            if request.base in claim_config.requests or (
                request.sub and request.result_name in claim_config.requests
            ):
                config.append(dict(entry))
                if compact:
                    break
    if compact:
        for entry in config:
            names = entry.get("requests")
            if names and all(r.base in names or (r.sub and r.result_name in names) for r in used):
                del entry["requests"]
    devices: dict[str, Any] = {"results": results}
    if config:
        devices["config"] = config
    allocation: dict[str, Any] = {"devices": devices}
    selector = _node_selector(search, [p.candidate for p in search.picked[ci]])
    if selector is not None:
        allocation["nodeSelector"] = selector
    return allocation


def chosen_subrequests(
    claim: ResourceClaim, allocation: Mapping[str, Any]
) -> tuple[tuple[str, int], ...]:
    """(request name, subrequest index) for each ``firstAvailable`` subrequest of ``claim``
    that some result of ``allocation`` names (``request/subrequest``), in spec order.

    Read from the results, not the search, so that a claim allocated earlier (by Lattice,
    kube-scheduler or anyone) reads the same as a fresh allocation: kube's score
    (``computeScore``) collects the subrequest references of the results and walks the
    claim's requests the same way. A valid allocation names at most one subrequest per
    request; one chosen without any device is named by no result and does not count,
    as in kube."""
    results = object_list(
        mapping(allocation.get("devices"), "status.allocation.devices").get("results"),
        "status.allocation.devices.results",
    )
    named = {r.get("request") for r in results}
    return tuple(
        (request.name, index)
        for request in claim.requests
        if request.exactly is None
        for index, sub in enumerate(request.first_available)
        if f"{request.name}/{sub.name}" in named
    )


def _node_selector(search: _Search, picked: Sequence[_Candidate]) -> dict[str, Any] | None:
    """kube's ``createNodeSelector``: the node's name if a device is node-local or
    ``bindsToNode`` (1.36+: such a device is allocatable from then only), else the
    union of the single-term selectors; a device of a ``perDeviceNodeSelection`` slice
    brings its own node selection instead of the slice's."""
    chosen = [
        (c.device.node_name, c.device.raw_node_selector, c.slice.name)
        if c.slice.per_device_node_selection
        else (c.slice.node_name, c.slice.raw_node_selector, c.slice.name)
        for c in picked
    ]
    if any(name for name, _, _ in chosen) or any(c.device.binds_to_node for c in picked):
        return {
            "nodeSelectorTerms": [
                {
                    "matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [search.node]}
                    ]
                }
            ]
        }
    fields: list[dict[str, Any]] = []
    expressions: list[dict[str, Any]] = []
    for _, raw, slice_name in chosen:
        if raw is None:
            continue
        terms = raw.get("nodeSelectorTerms") or []
        if not terms:
            continue  # kube: "Nothing?"
        if len(terms) != 1:
            raise AllocationError(
                f"unsupported ResourceSlice.NodeSelector with {len(terms)} terms "
                f"(slice {slice_name})"
            )
        term = terms[0]
        _merge(fields, term.get("matchFields") or [])
        _merge(expressions, term.get("matchExpressions") or [])
    if not fields and not expressions:
        return None
    merged: dict[str, Any] = {}
    if expressions:
        merged["matchExpressions"] = expressions
    if fields:
        merged["matchFields"] = fields
    return {"nodeSelectorTerms": [merged]}


def _merge(into: list[dict[str, Any]], requirements: Iterable[Mapping[str, Any]]) -> None:
    for r in requirements:
        values = set(r.get("values") or [])
        if not any(
            e.get("key") == r.get("key")
            and e.get("operator") == r.get("operator")
            and set(e.get("values") or []) == values
            for e in into
        ):
            into.append(dict(r))

"""NodeResourcesFit: free allocatable must cover the pod's effective request; scoring by
LeastAllocated (default) or MostAllocated.

Filter reasons, as in kube-scheduler: "Too many pods" when the node's pod count would exceed
allocatable ``pods``, and "Insufficient <resource>" for cpu, memory, ephemeral-storage and
every requested scalar resource (hugepages-*, extended resources such as nvidia.com/gpu). A
node lacking a resource entirely has zero allocatable, so any request is Insufficient. Several
reasons may be reported for one node. The node's code is UnschedulableAndUnresolvable when a
request exceeds the node's *total* allocatable (no eviction could help), Unschedulable
otherwise. Everything is integer arithmetic over whole columns.

DRA-backed extended resources (DRAExtendedResource, from 1.36): a requested resource some
DeviceClass serves is not checked on nodes whose allocatable lacks it (0 or absent), where
DynamicResources allocates devices for it instead (kube's ``shouldDelegateResourceToDRA``);
nodes whose allocatable has it (a device plugin) are checked as usual.

Scoring uses the node's non-zero requested cpu/memory (100m/200Mi per container without a
request) plus the pod's, per resource ``(alloc - requested) * 100 // alloc`` (least) or
``requested * 100 // alloc`` (most), averaged with integer weights over resources the node
has.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np

from scheduler.core.dra.extended import SINCE_MINOR as DRA_EXTENDED_SINCE
from scheduler.core.framework import PREFILTER_SUCCESS, Code, Cycle, FilterResult, PreFilterResult
from scheduler.core.plugins._normalize import MAX_NODE_SCORE
from scheduler.core.profile import (
    DYNAMIC_RESOURCES,
    NODE_RESOURCES_FIT,
    NodeResourcesFitArgs,
    Profile,
    ScoringStrategy,
)
from scheduler.core.snapshot import BoolArray, IntArray, Snapshot
from scheduler.model.names import (
    CPU,
    EPHEMERAL_STORAGE,
    MEMORY,
    is_extended_resource,
    is_scalar_resource,
)

NAME: Final = NODE_RESOURCES_FIT
REASON_TOO_MANY_PODS: Final = "Too many pods"
_UNSCHEDULABLE: Final = np.int8(Code.UNSCHEDULABLE)
_UNRESOLVABLE: Final = np.int8(Code.UNSCHEDULABLE_AND_UNRESOLVABLE)


def insufficient_reason(resource: str) -> str:
    return f"Insufficient {resource}"


@dataclass(frozen=True, slots=True)
class _Check:
    resource: str
    column: int | None
    amount: int
    delegable: bool = False
    """A DeviceClass serves the resource: nodes without it in allocatable are DRA's."""


class NodeResourcesFit:
    name: Final = NAME

    def __init__(self, args: NodeResourcesFitArgs, *, extended_resources: bool = True) -> None:
        self.args = args
        self.extended_resources = extended_resources
        """DRAExtendedResource (on from 1.36)."""

    def _ignored(self, resource: str) -> bool:
        if not is_extended_resource(resource):
            return False
        group = resource.split("/", 1)[0]
        return resource in self.args.ignored_resources or group in self.args.ignored_resource_groups

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        requests = cycle.pod.resources.requests
        snapshot = cycle.snapshot
        dra = cycle.dra if self.extended_resources and cycle.pod.container_requests else None
        checks: list[_Check] = []
        scalars = sorted(r for r in requests if r not in (CPU, MEMORY, EPHEMERAL_STORAGE))
        for resource in (CPU, MEMORY, EPHEMERAL_STORAGE, *scalars):
            amount = requests.get(resource, 0)
            if amount <= 0 or self._ignored(resource):
                continue
            delegable = dra is not None and dra.extended_class(resource) is not None
            checks.append(_Check(resource, snapshot.resource_column(resource), amount, delegable))
        cycle.state[NAME] = checks
        return PREFILTER_SUCCESS

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        snapshot = cycle.snapshot
        checks: list[_Check] = cycle.state[NAME]
        too_many = snapshot.pod_counts + 1 > snapshot.allowed_pods
        reasons: list[tuple[str, BoolArray]] = []
        codes = np.zeros(cycle.num_nodes, dtype=np.int8)
        if too_many.any():
            reasons.append((REASON_TOO_MANY_PODS, too_many))
            codes[too_many] = _UNSCHEDULABLE
        allocatable, requested = snapshot.allocatable, snapshot.requested
        for check in checks:
            if check.column is None:
                if check.delegable:
                    continue  # no node has it: DynamicResources serves it everywhere
                insufficient = np.ones(cycle.num_nodes, dtype=np.bool_)
                unresolvable = insufficient
            else:
                alloc = allocatable[check.column]
                insufficient = check.amount > alloc - requested[check.column]
                if check.delegable:
                    insufficient &= alloc > 0
                if not insufficient.any():
                    continue
                unresolvable = check.amount > alloc
            reasons.append((insufficient_reason(check.resource), insufficient))
            codes = np.maximum(
                codes,
                np.where(insufficient, np.where(unresolvable, _UNRESOLVABLE, _UNSCHEDULABLE), 0),
            ).astype(np.int8)
        if not reasons:
            return None
        return FilterResult(codes, tuple(reasons))

    def score(self, cycle: Cycle, feasible: BoolArray) -> IntArray | None:
        pod_requests = cycle.pod.resources.score_requests
        most = self.args.strategy is ScoringStrategy.MOST_ALLOCATED
        return resource_scores(
            cycle.snapshot,
            self.args.resources,
            pod_requests,
            use_non_zero=True,
            scorer=_most_requested if most else _least_requested,
        )


def resource_columns(
    snapshot: Snapshot, resource: str, pod_request: int, *, use_non_zero: bool
) -> tuple[IntArray, IntArray] | None:
    """(allocatable, requested-including-pod) of ``resource`` for every node row.

    None means the resource does not take part (kube returns 0,0 for a scalar resource the
    pod does not request, or one no node has); rows where allocatable is 0 must be skipped.
    """
    if pod_request == 0 and is_scalar_resource(resource):
        return None
    col = snapshot.resource_column(resource)
    if col is None:
        return None
    alloc = snapshot.allocatable[col]
    if use_non_zero and resource in (CPU, MEMORY):
        used = snapshot.non_zero_requested[0 if resource == CPU else 1]
    else:
        used = snapshot.requested[col]
    return alloc, used + pod_request


def _least_requested(alloc: IntArray, used: IntArray, safe_alloc: IntArray) -> IntArray:
    free = alloc - used
    scores: IntArray = np.maximum(free, 0) * MAX_NODE_SCORE // safe_alloc
    return scores  # free < 0 means requested > capacity, which scores 0


def _most_requested(alloc: IntArray, used: IntArray, safe_alloc: IntArray) -> IntArray:
    scores: IntArray = np.minimum(used, alloc) * MAX_NODE_SCORE // safe_alloc
    return scores


def resource_scores(
    snapshot: Snapshot,
    resources: tuple[tuple[str, int], ...],
    pod_requests: Mapping[str, int],
    *,
    use_non_zero: bool,
    scorer: Callable[[IntArray, IntArray, IntArray], IntArray],
) -> IntArray:
    """Weighted integer mean of per-resource scores over resources each node has.

    The common case (every node has every scored resource) needs no masking: the weight sum
    is a constant and the mean one scalar division.
    """
    n = snapshot.num_nodes
    total = np.zeros(n, dtype=np.int64)
    weight_sums: IntArray | int = 0
    for resource, weight in resources:
        request = pod_requests.get(resource, 0)
        cols = resource_columns(snapshot, resource, request, use_non_zero=use_non_zero)
        if cols is None:
            continue
        alloc, used = cols
        present = alloc > 0
        if present.all():
            per = scorer(alloc, used, alloc)
            total += per * weight if weight != 1 else per
            weight_sums = weight_sums + weight
        else:
            per = scorer(alloc, used, np.where(present, alloc, 1))
            total += np.where(present, per * weight, 0)
            weight_sums = weight_sums + np.where(present, weight, 0)
    if isinstance(weight_sums, int):
        return total // weight_sums if weight_sums else total
    divided: IntArray = np.where(weight_sums > 0, total // np.maximum(weight_sums, 1), 0)
    return divided


def new(profile: Profile) -> NodeResourcesFit:
    # Without DynamicResources nothing would allocate the devices: no resource is left to it.
    delegates = profile.kube_minor >= DRA_EXTENDED_SINCE and DYNAMIC_RESOURCES in profile.filters
    return NodeResourcesFit(profile.node_resources_fit, extended_resources=delegates)

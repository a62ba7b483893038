"""A cycle that counts nominated pods, as kube-scheduler's ``RunFilterPluginsWithNominatedPods``.

A pod that preempted is *nominated* to a node (``status.nominatedNodeName``) while its
victims terminate. Until it binds, the room it was promised must not go to a pod of lower
or equal priority: for such a pod a node passes only if the pod fits both with the
nominated pods of priority >= its own added on that node and without them (the second run
catches filters that pass only *because* of a nominated pod, such as required affinity).
Scores are computed without them.

How, over the vectorised framework: one ordinary cycle (the "without" run). Each node
that passed it and has nominated pods is then tried alone (``restrict_to``), with that
node's nominated pods added to the snapshot - only that node's, as kube adds them to one
NodeInfo copy at a time - and removed again at once. Nodes that fail there are *blocked*:
reported with the plugin and reasons of that trial, as Unschedulable (so preemption may
still consider them), and the winner is picked by a second cycle restricted to the nodes
left. No nomination on a feasible node: the first cycle's decision, unchanged.

Devices (not in kube). kube adds a nominated pod to a node through each plugin's
``PreFilterExtensions``, and DynamicResources has none (1.37 too): the devices a DRA
preemptor freed go to whichever pod asks first, a lower-priority one included, and the
preemptor evicts again. Lattice holds them: for a pod that may use devices (claims, or
extended resources a DeviceClass may serve), every nominated pod of priority >= its own
with claims, or with extended resources its nominated node serves by DRA, has its claims
(and that node's claim for those resources) planned on its nominated node
(:meth:`~scheduler.core.plugins.dynamic_resources.DynamicResources.nominee_hold`; highest
priority first, then by key, each with the devices of those before it in use), and those
devices (and the capacity of the shares of multi-allocatable devices among them) count as
in use for the whole decision
(:meth:`~scheduler.core.dra.state.DraState.hold_for_nominated`), on every node (a
network-attached pool is seen by several). The hold lasts as long as the nomination: it
ends when the nominee binds, is deleted, is nominated elsewhere or loses its nomination.

Pure: the snapshot is mutated during the call and restored before it returns; so is the
device hold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from scheduler.core.batch import Batch
from scheduler.core.dra.state import Hold
from scheduler.core.explain import (
    ABSENT,
    PREFILTER_REJECTED,
    Decision,
    FilterRecord,
)
from scheduler.core.framework import Code, FilterResult
from scheduler.core.load import LoadView
from scheduler.core.plugins.dynamic_resources import DynamicResources
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.core.topology.state import TopologyState
from scheduler.model.pod import Pod

if TYPE_CHECKING:
    from scheduler.core.dra.search import DeviceSearch
    from scheduler.core.dra.state import DraState
    from scheduler.core.quota import QuotaContext
    from scheduler.core.volumes import VolumeState


def nominated_by_node(
    snapshot: Snapshot, pod: Pod, nominated: Sequence[tuple[Pod, str]]
) -> dict[str, list[Pod]]:
    """The nominated pods that count for ``pod``, by node: priority >= its own, not the pod
    itself, not placed already (an assumed or bound pod counts on its node anyway), on a
    node of the snapshot."""
    out: dict[str, list[Pod]] = {}
    for other, node in nominated:
        if other.key == pod.key or other.priority < pod.priority:
            continue
        if snapshot.node_of_pod(other.key) is not None or snapshot.index_of(node) is None:
            continue
        out.setdefault(node, []).append(other)
    return out


def nominee_hold(
    framework: Framework,
    snapshot: Snapshot,
    pod: Pod,
    nominated: Sequence[tuple[Pod, str]],
    dra: DraState | None,
    *,
    uses_devices: bool | None = None,
) -> Hold:
    """The devices and shares held for the nominated pods that count for ``pod`` (see the
    module docstring); empty for a pod that cannot use devices (``uses_devices``: whether
    it may, if not from its own spec: a gang's lowest member stands for all its members)."""
    if uses_devices is None:
        uses_devices = bool(pod.resource_claims or pod.container_requests)
    if dra is None or not nominated or not uses_devices:
        return Hold()
    plugin = next(
        (p for p in framework.plugins.claim_planners if isinstance(p, DynamicResources)), None
    )
    if plugin is None:
        return Hold()
    nominees = sorted(
        (
            (other, node)
            for node, pods in nominated_by_node(snapshot, pod, nominated).items()
            for other in pods
            if other.resource_claims or other.container_requests
        ),
        key=lambda entry: (-entry[0].priority, entry[0].key),
    )
    taken = Hold()
    for other, node in nominees:
        taken |= plugin.nominee_hold(snapshot, other, node, dra, taken)
    return taken


@contextmanager
def nominee_devices_held(
    framework: Framework,
    snapshot: Snapshot,
    pod: Pod,
    nominated: Sequence[tuple[Pod, str]],
    dra: DraState | None,
    *,
    uses_devices: bool | None = None,
) -> Iterator[None]:
    """:func:`nominee_hold` counted as in use in ``dra`` within the block (the hold
    before it is restored after)."""
    held = nominee_hold(framework, snapshot, pod, nominated, dra, uses_devices=uses_devices)
    if dra is None or not held:
        yield
        return
    before = dra.nominated_hold()
    both = before | held
    dra.hold_for_nominated(both.devices, both.shares)
    try:
        yield
    finally:
        dra.hold_for_nominated(before.devices, before.shares)


def schedule_with_nominated(
    framework: Framework,
    snapshot: Snapshot,
    pod: Pod,
    nominated: Sequence[tuple[Pod, str]],
    *,
    seed: int = 0,
    topology: TopologyState | None = None,
    load: LoadView | None = None,
    restrict_to: frozenset[str] | None = None,
    volumes: VolumeState | None = None,
    dra: DraState | None = None,
    batch: Batch | None = None,
    search: DeviceSearch | None = None,
    quota: QuotaContext | None = None,
) -> Decision:
    """:meth:`Framework.schedule` with ``nominated`` (pending pods and their nominated
    nodes) counted as described in the module docstring; ``batch`` only serves a cycle
    without nominated pods (kube's batching too stops at a nomination)."""
    with nominee_devices_held(framework, snapshot, pod, nominated, dra):
        return _schedule_with_nominated(
            framework,
            snapshot,
            pod,
            nominated,
            seed=seed,
            topology=topology,
            load=load,
            restrict_to=restrict_to,
            volumes=volumes,
            dra=dra,
            batch=batch,
            search=search,
            quota=quota,
        )


def _schedule_with_nominated(
    framework: Framework,
    snapshot: Snapshot,
    pod: Pod,
    nominated: Sequence[tuple[Pod, str]],
    *,
    seed: int,
    topology: TopologyState | None,
    load: LoadView | None,
    restrict_to: frozenset[str] | None,
    volumes: VolumeState | None,
    dra: DraState | None,
    batch: Batch | None,
    search: DeviceSearch | None,
    quota: QuotaContext | None,
) -> Decision:

    def run(only: frozenset[str] | None) -> Decision:
        return framework.schedule(
            snapshot,
            pod,
            seed=seed,
            topology=topology,
            load=load,
            restrict_to=only,
            volumes=volumes,
            dra=dra,
            batch=None if nominated else batch,
            search=search,
            quota=quota,
        )

    without = run(restrict_to)
    if without.selected is None or not nominated:
        return without
    by_node = nominated_by_node(snapshot, pod, nominated)
    feasible = set(without.feasible)
    blocked: dict[str, FilterRecord] = {}
    for node in sorted(n for n in by_node if n in feasible):
        pods = by_node[node]
        for other in pods:
            snapshot.add_pod(other, node)
        try:
            trial = run(frozenset({node}))
        finally:
            for other in pods:
                snapshot.remove_pod(other)
        if trial.selected is None:
            blocked[node] = _record_at(trial, node)
    if not blocked:
        return without
    allowed = frozenset(feasible - blocked.keys())
    base = run(allowed) if allowed else None
    explanation = without.explanation
    filters = list(explanation.filters)
    rejected_by = explanation.rejected_by.copy()
    for node, record in blocked.items():
        row = snapshot.index_of(node)
        assert row is not None
        filters.append(record)
        rejected_by[row] = len(filters) - 1
    if base is None:
        merged = dataclasses.replace(
            explanation,
            rejected_by=rejected_by,
            filters=tuple(filters),
            feasible_rows=np.zeros(0, dtype=np.intp),
            scores=(),
            totals=np.zeros(explanation.num_nodes, dtype=np.int64),
            skipped_scores=(),
            preferences=(),
        )
        return Decision(pod, None, merged, seed)
    for name in allowed:  # a node the restricted run rejected after all: its verdict
        row = snapshot.index_of(name)
        assert row is not None
        if int(base.explanation.rejected_by[row]) >= 0:
            filters.append(_record_at(base, name))
            rejected_by[row] = len(filters) - 1
    merged = dataclasses.replace(
        explanation,
        rejected_by=rejected_by,
        filters=tuple(filters),
        feasible_rows=base.explanation.feasible_rows,
        scores=base.explanation.scores,
        totals=base.explanation.totals,
        skipped_scores=base.explanation.skipped_scores,
        preferences=base.explanation.preferences,
    )
    return Decision(
        pod, base.selected, merged, seed, base.annotations, base.volume_plan, base.claim_plan
    )


def _record_at(decision: Decision, node: str) -> FilterRecord:
    """The verdict of a failed single-node run as a filter record for that node's row."""
    explanation = decision.explanation
    row = explanation.node_names.index(node)
    by = int(explanation.rejected_by[row])
    if by >= 0:
        return explanation.filters[by]
    status = explanation.prefilter_rejection if by == PREFILTER_REJECTED else None
    if by == ABSENT:
        status = explanation.absent
    mask = np.zeros(explanation.num_nodes, dtype=np.bool_)
    mask[row] = True
    if status is None:  # not expected: a failed run names a reason for its one node
        result = FilterResult.from_mask(mask, "nominated pods", Code.UNSCHEDULABLE)
        return FilterRecord("NominatedPods", result)
    return FilterRecord(status.plugin, FilterResult.from_mask(mask, status.message, status.code))

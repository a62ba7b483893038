"""Topology: place a pod's GPUs, RDMA NICs and pinned CPUs together, and say which.

kube-scheduler counts GPUs per node; the kubelet then finds them split across PCIe switches
or NUMA nodes and runs the job slowly, or (topology policy single-numa-node) rejects it.
This plugin reads each node's topology (:class:`~scheduler.core.topology.state.TopologyState`,
which the controller keeps next to the snapshot), picks the devices on every candidate node
(:mod:`scheduler.core.topology.allocate`) and

* **filters** nodes where the pod's required alignment cannot be met: ``strict`` (the
  tightest domain the node's hardware offers: one PCIe switch if some switch holds the
  request, else one NUMA node), ``numa``, or what the node's kubelet enforces anyway
  (single-numa-node: one NUMA node for devices and pinned CPUs; restricted: one NUMA node
  when the hardware allows). Nodes without a topology report reject strict and numa pods;
* **scores** the others 0..100: 3/5 alignment (the hardware's best device cost for this
  request over the chosen set's cost, so same switch > same NUMA > across NUMA, weighted by
  PCIe link levels and SLIT distances) and 2/5 packing (fill partly used switches, NUMA
  nodes and nodes first, keeping whole ones for large pods). Nodes with unknown alignment
  score a neutral 50;
* **annotates** the chosen node's devices (``lattice.dev/devices``) so the binder records
  them on the pod and the ledger counts them.

PreFilter skips pods that want no GPU, no RDMA NIC and no pinned CPU on a node that would
pin them: for those the profile is exactly kube-scheduler's. Node GPU *counts* stay with
NodeResourcesFit, which runs first, so its reasons and codes are unchanged; a node where
this plugin's own view has too few free devices (a pod placed by another scheduler, say)
but no alignment is required passes with a neutral score, as kube-scheduler would place it.
"""

from __future__ import annotations

from collections.abc import Hashable
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
from scheduler.core.plugins._normalize import MAX_NODE_SCORE
from scheduler.core.profile import TOPOLOGY, GpuAlignment, Profile, TopologyArgs
from scheduler.core.snapshot import BoolArray, IntArray
from scheduler.core.topology.allocate import Choice, FreeState, Level
from scheduler.core.topology.layout import NodeLayout
from scheduler.core.topology.ledger import DeviceAssignment
from scheduler.core.topology.request import (
    DEVICES_ANNOTATION,
    InvalidTopologyRequest,
    TopologyRequest,
)
from scheduler.core.topology.state import TopologyState
from scheduler.model.names import CPU

NAME: Final = TOPOLOGY
NEUTRAL_SCORE: Final = 50
"""Score of a node whose alignment is unknown (no topology report)."""
ALIGNMENT_SHARE: Final = 3
PACKING_SHARE: Final = 2
"""The score is 3/5 alignment and 2/5 packing: enough packing to outweigh LeastAllocated's
spreading of GPU pods, while a better-aligned node still wins (the aligned choice fills its
domain, so it packs well too)."""
REASON_NO_REPORT: Final = "node(s) had no topology report"
_UNSCHEDULABLE: Final = np.int8(Code.UNSCHEDULABLE)
_UNRESOLVABLE: Final = np.int8(Code.UNSCHEDULABLE_AND_UNRESOLVABLE)


@dataclass(frozen=True, slots=True)
class Placement:
    """This plugin's choice on one node row."""

    layout: NodeLayout
    choice: Choice
    ideal: Choice
    """The best the node's hardware allows for this request (the node empty)."""

    @property
    def score(self) -> int:
        if self.choice.cost <= self.ideal.cost:
            align = MAX_NODE_SCORE
        else:
            align = MAX_NODE_SCORE * self.ideal.cost // self.choice.cost
        weighted = ALIGNMENT_SHARE * align + PACKING_SHARE * self.choice.pack
        return weighted // (ALIGNMENT_SHARE + PACKING_SHARE)

    def assignment(self) -> DeviceAssignment:
        lay, c = self.layout, self.choice
        gpus = tuple(i for i in (lay.gpu_index[s] for s in c.gpus) if i is not None)
        nics = tuple(a for a in (lay.nic_address[s] for s in c.nics) if a is not None)
        numa = lay.numa_ids[c.zone] if c.zone is not None else None
        return DeviceAssignment(gpus, nics, numa)


_Outcome = Placement | tuple[str, np.int8] | None
"""A placement, a rejection (reason, code), or None: the node passes with nothing to record."""


@dataclass(slots=True)
class _CycleState:
    request: TopologyRequest
    placements: dict[int, Placement] = field(default_factory=dict)


def describe(request: TopologyRequest) -> str:
    """ "4 GPUs and an RDMA NIC" — the request as reasons name it."""
    parts = []
    if request.gpus:
        parts.append(f"{request.gpus} GPU{'s' if request.gpus != 1 else ''}")
    if request.nics:
        parts.append("an RDMA NIC" if request.nics == 1 else f"{request.nics} RDMA NICs")
    return " and ".join(parts)


class Topology:
    name: Final = NAME

    def __init__(self, args: TopologyArgs) -> None:
        self.args = args

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        try:
            request = TopologyRequest.from_pod(cycle.pod, self.args)
        except InvalidTopologyRequest as exc:
            requests = cycle.pod.resources.requests
            if requests.get(self.args.gpu_resource) or requests.get(self.args.rdma_resource):
                return PreFilterResult(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, str(exc))
            return PREFILTER_SKIP
        state = cycle.topology
        pins = request.cpus > 0 and state is not None and state.pins_cpus_anywhere()
        if not request.wants_devices and not pins:
            return PREFILTER_SKIP
        cycle.state[NAME] = _CycleState(request)
        return PREFILTER_SUCCESS

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        cs: _CycleState = cycle.state[NAME]
        request, state = cs.request, cycle.topology
        n = cycle.num_nodes
        codes = np.zeros(n, dtype=np.int8)
        reasons: dict[str, BoolArray] = {}

        def reject(row: int, reason: str, code: np.int8) -> None:
            mask = reasons.get(reason)
            if mask is None:
                mask = reasons[reason] = np.zeros(n, dtype=np.bool_)
            mask[row] = True
            codes[row] = code

        needs_report = request.wants_devices and request.alignment is not GpuAlignment.PREFERRED
        if state is None or not state.has_topology():
            if not needs_report:
                return None
            return FilterResult.from_mask(
                candidates.copy(), REASON_NO_REPORT, Code.UNSCHEDULABLE_AND_UNRESOLVABLE
            )
        names = cycle.snapshot.node_names
        cpu_col = cycle.snapshot.resource_column(CPU)
        alloc_cpus = cycle.snapshot.allocatable[cpu_col] // 1000 if cpu_col is not None else None
        # Nodes with the same hardware and the same free devices get the same outcome.
        memo: dict[tuple[int, Hashable], _Outcome] = {}
        for row in np.flatnonzero(candidates).tolist():
            name = names[row]
            layout, serial = state.layout(name), state.serial(name)
            if layout is None or serial is None:
                if needs_report:
                    reject(row, REASON_NO_REPORT, _UNRESOLVABLE)
                continue
            cpus = int(alloc_cpus[row]) if alloc_cpus is not None else None
            free = state.free(name, cpus)
            assert free is not None
            key = (serial, free.key)
            if key in memo:
                outcome = memo[key]
            else:
                outcome = memo[key] = self.place(state, name, layout, request, free)
            if isinstance(outcome, Placement):
                cs.placements[row] = outcome
            elif outcome is not None:
                reject(row, outcome[0], outcome[1])
        if not reasons:
            return None
        return FilterResult(codes, tuple(reasons.items()))

    def place(
        self,
        state: TopologyState,
        name: str,
        layout: NodeLayout,
        request: TopologyRequest,
        free: FreeState,
    ) -> _Outcome:
        """The outcome on one node (see :data:`_Outcome`); public because the gang solver
        simulates how many members the node can align with the same placement."""
        pin = layout.single_numa and layout.pins_cpus and request.cpus > 0
        if not request.wants_devices and not pin:
            return None
        ideal = state.choose(name, None, request, Level.CROSS, pin_cpus=pin)
        required = Level.CROSS
        if request.alignment is GpuAlignment.STRICT:
            required = min(ideal.level, Level.NUMA) if ideal is not None else Level.NUMA
        elif request.alignment is GpuAlignment.NUMA:
            required = Level.NUMA
        if request.wants_devices and (
            layout.single_numa
            or (layout.restricted and ideal is not None and ideal.level <= Level.NUMA)
        ):
            required = min(required, Level.NUMA)
        if ideal is None or ideal.level > required:
            if required is Level.CROSS and not pin:
                return None  # the report lists fewer devices than the node advertises
            if pin and not request.wants_devices:
                return f"node(s) cannot pin {request.cpus} CPUs on one NUMA node", _UNRESOLVABLE
            return f"node(s) cannot hold {describe(request)} on one NUMA node", _UNRESOLVABLE
        choice = state.choose(name, free, request, required, pin_cpus=pin)
        if choice is not None:
            return Placement(layout, choice, ideal)
        if required is Level.CROSS and not pin:
            return None
        if pin and (
            not request.wants_devices
            or state.choose(name, free, request, required, pin_cpus=False) is not None
        ):
            return f"node(s) didn't have {request.cpus} free CPUs on one NUMA node", _UNSCHEDULABLE
        where = "under one PCIe switch" if required is Level.SWITCH else "on one NUMA node"
        return f"node(s) didn't have {describe(request)} free {where}", _UNSCHEDULABLE

    def score(self, cycle: Cycle, feasible: BoolArray) -> IntArray | None:
        cs: _CycleState | None = cycle.state.get(NAME)
        if cs is None or not cs.request.wants_devices or not cs.placements:
            return None
        scores = np.full(cycle.num_nodes, NEUTRAL_SCORE, dtype=np.int64)
        for row, placement in cs.placements.items():
            scores[row] = placement.score
        return scores

    def annotate(self, cycle: Cycle, row: int) -> dict[str, str]:
        cs: _CycleState | None = cycle.state.get(NAME)
        placement = cs.placements.get(row) if cs is not None else None
        if placement is None:
            return {}
        return {DEVICES_ANNOTATION: placement.assignment().to_annotation()}


def new(profile: Profile) -> Topology:
    return Topology(profile.topology)

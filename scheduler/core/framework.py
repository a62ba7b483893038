"""The plugin framework: outcome values, per-cycle context and extension-point protocols.

Theory of operation (kube-scheduler's framework, vectorised): a scheduling cycle runs the
PreFilter extension of every enabled filter plugin in profile order, then the Filter
extension over *all candidate nodes at once*, then Score over all feasible nodes at once.

* PreFilter returns a :class:`PreFilterResult`: Skip (the plugin has nothing to check for
  this pod, so its Filter is not run — the cheap path for plain pods), Success optionally
  restricting the candidate node names, or a rejection of the whole pod with one message.
* Filter returns a :class:`FilterResult`: a per-node status code (0 = passes) and one
  boolean mask per reason string. A node may carry several reasons from one plugin
  (NodeResourcesFit reports "Insufficient cpu" and "Insufficient memory" together); the
  framework attributes each node to the *first* plugin that rejects it, as kube-scheduler
  stops at the first failing filter per node.
* Score returns normalised integer scores 0..100 per node row, computed over whole columns
  with only the feasible rows mattering (no gathers), or None to skip (kube-scheduler's
  PreScore Skip); the framework multiplies by the profile weight.
* Annotate (Lattice's, after selection) returns pod annotations for the chosen node row,
  which the binder writes with the binding: the Topology plugin records the devices it
  picked this way, so the choice survives a scheduler restart.
* VolumePlan (after selection) returns the PV claimRefs and PVC selected-node annotations
  to write, and the claims to wait for, before the binding (kube's VolumeBinding PreBind,
  as data rather than I/O). ClaimPlan does the same for DRA ResourceClaims.
* A Filter may mark a node with Code.ERROR (DynamicResources' allocator errors): as in
  kube, that ends the whole attempt with an error, whatever the other nodes say.

Outcomes are values; exceptions are for bugs. :class:`Code` keeps kube-scheduler's numbering
so Unschedulable (may pass after preemption/cluster change) and UnschedulableAndUnresolvable
(nothing but a node change helps) can drive the queue.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

from scheduler.core.snapshot import BoolArray, IntArray, Snapshot
from scheduler.model.node import Taint, TaintEffect
from scheduler.model.pod import UNSCHEDULABLE_TAINT_KEY, Pod, tolerates

if TYPE_CHECKING:
    from scheduler.core.dra.search import DeviceSearch
    from scheduler.core.dra.state import ClaimPlan, DraState
    from scheduler.core.load import LoadView
    from scheduler.core.quota import QuotaContext
    from scheduler.core.topology.state import TopologyState
    from scheduler.core.volumes import VolumePlan, VolumeState

CodeArray = npt.NDArray[np.int8]
T = TypeVar("T")


class Code(IntEnum):
    """kube-scheduler's status codes (same numeric values)."""

    SUCCESS = 0
    ERROR = 1
    UNSCHEDULABLE = 2
    UNSCHEDULABLE_AND_UNRESOLVABLE = 3
    SKIP = 5


@dataclass(frozen=True, slots=True)
class PreFilterResult:
    code: Code = Code.SUCCESS
    message: str = ""
    node_names: frozenset[str] | None = None
    """On success, restrict filtering to these nodes (None = all nodes)."""

    @property
    def rejected(self) -> bool:
        return self.code in (Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE)


PREFILTER_SUCCESS = PreFilterResult()
PREFILTER_SKIP = PreFilterResult(Code.SKIP)


@dataclass(frozen=True, slots=True)
class FilterResult:
    """One filter plugin's verdict over every snapshot node.

    Invariant: ``codes[i] != 0`` exactly when some reason mask is true at ``i``. Values at
    nodes that were not candidates are ignored by the framework.
    """

    codes: CodeArray
    reasons: tuple[tuple[str, BoolArray], ...]

    @classmethod
    def from_mask(cls, rejected: BoolArray, reason: str, code: Code) -> FilterResult:
        codes = np.where(rejected, np.int8(code), np.int8(0)).astype(np.int8)
        return cls(codes, ((reason, rejected),))

    @classmethod
    def passing(cls, num_nodes: int) -> FilterResult:
        return cls(np.zeros(num_nodes, dtype=np.int8), ())

    @property
    def rejected(self) -> BoolArray:
        rejected: BoolArray = self.codes != 0
        return rejected

    def reasons_at(self, index: int) -> list[str]:
        return [reason for reason, mask in self.reasons if mask[index]]


class Cycle:
    """Everything one scheduling attempt shares between plugins.

    Plugins keep their PreFilter/PreScore results in :attr:`state` under their own name.
    Common derived vectors (the pod's required node affinity, its untolerated taints) are
    memoised here so several plugins can reuse them.
    """

    __slots__ = (
        "_memo",
        "dra",
        "load",
        "pod",
        "quota",
        "search",
        "snapshot",
        "state",
        "topology",
        "volumes",
    )

    def __init__(
        self,
        snapshot: Snapshot,
        pod: Pod,
        *,
        topology: TopologyState | None = None,
        load: LoadView | None = None,
        volumes: VolumeState | None = None,
        dra: DraState | None = None,
        search: DeviceSearch | None = None,
        quota: QuotaContext | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.pod = pod
        # Node topologies and device usage, kept by the controller next to the snapshot.
        self.topology = topology
        # Predicted node load (None: no predictor, LoadAware stays out of the way).
        self.load = load
        # PVs, PVCs, StorageClasses, CSINodes (None: volume plugins stay out, and
        # Unsupported refuses pods with claims).
        self.volumes = volumes
        # DeviceClasses, ResourceClaims, ResourceSlices and assumed allocations (None:
        # DynamicResources stays out, and Unsupported refuses pods with resource claims).
        self.dra = dra
        # The attempt's device search (None: DynamicResources searches inline, with a
        # budget of its own; see scheduler.core.dra.search).
        self.search = search
        # ElasticQuotas and their usage (None: CapacityScheduling stays out of the way).
        self.quota = quota
        self.state: dict[str, Any] = {}
        self._memo: dict[str, Any] = {}

    @property
    def num_nodes(self) -> int:
        return self.snapshot.num_nodes

    def memo(self, key: str, compute: Callable[[], T]) -> T:
        if key not in self._memo:
            self._memo[key] = compute()
        value: T = self._memo[key]
        return value

    def required_node_affinity_mask(self) -> BoolArray:
        """Nodes matching ``spec.nodeSelector`` and the required node affinity."""
        return self.memo("required_node_affinity", self._required_node_affinity)

    def _required_node_affinity(self) -> BoolArray:
        pod, snap = self.pod, self.snapshot
        mask = np.ones(snap.num_nodes, dtype=np.bool_)
        if pod.node_selector:
            mask &= snap.label_map_mask(pod.node_selector)
        if pod.required_node_affinity is not None:
            mask &= snap.node_selector_mask(pod.required_node_affinity)
        return mask

    def untolerated_taint_mask(self) -> BoolArray:
        """Nodes with a NoSchedule/NoExecute taint the pod does not tolerate."""
        return self.memo("untolerated_taints", self._untolerated_taints)

    def _untolerated_taints(self) -> BoolArray:
        snap = self.snapshot
        if not self.pod.tolerations:
            tainted: BoolArray = snap.hard_taint_counts > 0
            return tainted
        cols = [
            j
            for j, taint in enumerate(snap.taints)
            if taint.blocks_scheduling and not tolerates(self.pod.tolerations, taint)
        ]
        if not cols:
            return np.zeros(snap.num_nodes, dtype=np.bool_)
        return np.asarray(snap.taint_matrix[:, cols].any(axis=1), dtype=np.bool_)

    def untolerated_soft_taint_counts(self) -> IntArray:
        """Untolerated PreferNoSchedule taints (tolerations with effect "" or PreferNoSchedule)."""
        snap = self.snapshot
        relevant = tuple(
            t for t in self.pod.tolerations if t.effect in ("", TaintEffect.PREFER_NO_SCHEDULE)
        )
        if not relevant:
            return snap.soft_taint_counts.astype(np.int64)
        cols = [
            j
            for j, taint in enumerate(snap.taints)
            if taint.effect == TaintEffect.PREFER_NO_SCHEDULE and not tolerates(relevant, taint)
        ]
        if not cols:
            return np.zeros(snap.num_nodes, dtype=np.int64)
        counts: IntArray = snap.taint_matrix[:, cols].sum(axis=1, dtype=np.int64)
        return counts

    def tolerates_unschedulable(self) -> bool:
        taint = Taint(UNSCHEDULABLE_TAINT_KEY, "", TaintEffect.NO_SCHEDULE.value)
        return tolerates(self.pod.tolerations, taint)


@runtime_checkable
class Plugin(Protocol):
    @property
    def name(self) -> str: ...


@runtime_checkable
class PreFilterPlugin(Plugin, Protocol):
    def pre_filter(self, cycle: Cycle) -> PreFilterResult: ...


@runtime_checkable
class FilterPlugin(Plugin, Protocol):
    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        """Verdict over all nodes (only ``candidates`` matter); None when every node passes."""
        ...


@runtime_checkable
class ScorePlugin(Plugin, Protocol):
    def score(self, cycle: Cycle, feasible: BoolArray) -> IntArray | None:
        """Normalised 0..100 scores per node row (only ``feasible`` rows matter, and
        normalisation considers only them); None to skip the plugin for this pod."""
        ...


@dataclass(frozen=True, slots=True)
class Preference:
    """Feasible nodes a plugin would rather not use, with the reasons why.

    The framework ranks these after every other feasible node, whatever their scores, and
    ignores the verdict when it covers every feasible node (a preference never makes a pod
    unschedulable).
    """

    reasons: tuple[tuple[str, BoolArray], ...]

    def __post_init__(self) -> None:
        if not self.reasons:
            raise ValueError("a Preference needs at least one reason (return None instead)")

    @property
    def passed_over(self) -> BoolArray:
        mask: BoolArray = np.logical_or.reduce([m for _, m in self.reasons])
        return mask

    def reasons_at(self, index: int) -> list[str]:
        return [reason for reason, mask in self.reasons if mask[index]]


@runtime_checkable
class PreferPlugin(Plugin, Protocol):
    def prefer(self, cycle: Cycle, feasible: BoolArray) -> Preference | None:
        """Nodes to rank last (only ``feasible`` rows matter); None when there are none.

        Only score plugins of the profile are asked, after scoring.
        """
        ...


@runtime_checkable
class AnnotatePlugin(Plugin, Protocol):
    def annotate(self, cycle: Cycle, row: int) -> Mapping[str, str]:
        """Pod annotations to write with the binding to the selected node row (e.g. the
        devices chosen for the pod); empty when the plugin has nothing to record."""
        ...


@runtime_checkable
class VolumePlanPlugin(Plugin, Protocol):
    def volume_plan(self, cycle: Cycle, row: int) -> VolumePlan | None:
        """The PV and PVC writes that must precede binding the pod to the selected node row
        (kube's PreBind, as data); None when the pod's volumes need none."""
        ...


@runtime_checkable
class ClaimPlanPlugin(Plugin, Protocol):
    def claim_plan(self, cycle: Cycle, row: int) -> ClaimPlan | None:
        """The ResourceClaim writes (allocations, reservations) that must precede binding
        the pod to the selected node row (kube's DRA Reserve/PreBind, as data)."""
        ...


@dataclass(frozen=True, slots=True)
class PluginSet:
    """Plugins instantiated for one profile, in execution order."""

    pre_filters: tuple[PreFilterPlugin, ...]
    filters: tuple[FilterPlugin, ...]
    scores: tuple[tuple[ScorePlugin, int], ...] = field(default=())
    annotators: tuple[AnnotatePlugin, ...] = field(default=())
    preferences: tuple[PreferPlugin, ...] = field(default=())
    """Score plugins that also rank some nodes last (in score order)."""
    volume_planners: tuple[VolumePlanPlugin, ...] = field(default=())
    """Filter plugins that name writes to make before binding (VolumeBinding)."""
    claim_planners: tuple[ClaimPlanPlugin, ...] = field(default=())
    """Filter plugins that name ResourceClaim writes before binding (DynamicResources)."""

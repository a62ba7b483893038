"""Scheduling profiles: which plugins run, in what order, with which weights and arguments.

The defaults reproduce the default profile of kube-scheduler at :attr:`Profile.kube_minor`
(1.35 to 1.37; the controller sets it from the API server's version) restricted to the plugins
the core implements (no ImageLocality or preemption). Filter order matters: a
node is attributed to the first filter that rejects it, and that is what FailedScheduling
messages count.

NodeDeclaredFeatures is in the filter list of every release, after DynamicResources where
kube's defaults append it once its gate is on (1.36 beta, 1.37 GA); at 1.35, whose gate is
off by default, it is the no-op kube's plugin is when disabled (every pod skips it).

The volume plugins (VolumeRestrictions, NodeVolumeLimits, VolumeBinding, VolumeZone) need
the controller's VolumeState in the cycle, DynamicResources its DraState. Pods that need
what is still missing (inline disks with conflict or attach-limit rules when the cycle has
no VolumeState, PVC-backed or generic ephemeral volumes when it has none or VolumeBinding is
disabled, DRA resource claims when it has no DraState or DynamicResources is disabled, and
claims using alpha DRA fields) are refused first, by the Unsupported plugin, rather than
bound where their volumes or devices cannot follow; every other pod skips it.

CapacityScheduling (scheduler-plugins' ElasticQuota admission, :mod:`scheduler.core.quota`)
runs right after Unsupported: a PreFilter only, refusing the pods of a namespace with an
ElasticQuota that would pass its ``max`` or the sum of all quotas' ``min``; every other pod,
and every pod of a cycle without quotas (simulations, tests), skips it.

Lattice adds two plugins of its own, last among the filters. Topology (device and NUMA
alignment) skips every pod that asks for no GPUs, RDMA NICs or pinned CPUs. LoadAware
(measured and predicted node load) filters only when a threshold is configured (none is by
default) and scores only when some node has a fresh load report. GPUPlacement (a score
only) ranks GPU pods' nodes by fragmentation and keeps pods without GPUs off free GPUs; it
skips wherever no feasible node has a free GPU. Without free GPUs and without node agents
the profile therefore behaves exactly like kube-scheduler's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from scheduler.core.dra.binding import BINDING_TIMEOUT
from scheduler.core.dra.search import SEARCH_BUDGET
from scheduler.model.names import CPU, MEMORY
from scheduler.model.release import DEFAULT_KUBE_MINOR as DEFAULT_KUBE_MINOR
from scheduler.model.release import NEWEST_KUBE_MINOR as NEWEST_KUBE_MINOR
from scheduler.model.release import OLDEST_KUBE_MINOR as OLDEST_KUBE_MINOR
from scheduler.model.release import nearest_kube_minor as nearest_kube_minor
from scheduler.model.selectors import EVERYTHING, LabelSelector
from scheduler.model.topology import GPU_RESOURCE, RDMA_RESOURCE
from scheduler.predict import PredictConfig


def _check_weights(what: str, pairs: tuple[tuple[str, int], ...]) -> None:
    for name, weight in pairs:
        if isinstance(weight, bool) or not isinstance(weight, int) or weight <= 0:
            raise ValueError(f"{what}: weight of {name!r} must be a positive integer")


class ScoringStrategy(StrEnum):
    LEAST_ALLOCATED = "LeastAllocated"
    MOST_ALLOCATED = "MostAllocated"


DEFAULT_SCORE_RESOURCES: Final = ((CPU, 1), (MEMORY, 1))


@dataclass(frozen=True, slots=True)
class NodeResourcesFitArgs:
    strategy: ScoringStrategy = ScoringStrategy.LEAST_ALLOCATED
    resources: tuple[tuple[str, int], ...] = DEFAULT_SCORE_RESOURCES
    """Resources scored and their weights (kube: scoringStrategy.resources)."""
    ignored_resources: frozenset[str] = frozenset()
    """Extended resources the filter does not check."""
    ignored_resource_groups: frozenset[str] = frozenset()
    """Extended resource domains (prefix before '/') the filter does not check."""

    def __post_init__(self) -> None:
        _check_weights("NodeResourcesFit.resources", self.resources)


@dataclass(frozen=True, slots=True)
class BalancedAllocationArgs:
    resources: tuple[tuple[str, int], ...] = DEFAULT_SCORE_RESOURCES

    def __post_init__(self) -> None:
        _check_weights("NodeResourcesBalancedAllocation.resources", self.resources)


@dataclass(frozen=True, slots=True)
class InterPodAffinityArgs:
    hard_pod_affinity_weight: int = 1
    """Score weight of existing pods' *required* affinity terms that the incoming pod matches."""
    ignore_preferred_terms_of_existing_pods: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.hard_pod_affinity_weight <= 100:
            raise ValueError("hard_pod_affinity_weight must be within 0..100")


STORAGE_CAPACITY_SCORING_SINCE: Final = 37
"""StorageCapacityScoring (KEP-4049) is beta and on from 1.37 (alpha and off in 1.35-1.36):
VolumeBinding scores only from then on, and takes a ``shape`` only then."""
MAX_SHAPE_SCORE: Final = 10
"""kube's ``MaxCustomPriorityScore``: shape scores are 0..10, scaled by 10 to 0..100."""
DEFAULT_VOLUME_SHAPE: Final = ((0, MAX_SHAPE_SCORE), (100, 0))
"""kube's default VolumeBindingArgs shape from 1.37: emptier storage scores higher."""


@dataclass(frozen=True, slots=True)
class VolumeBindingArgs:
    shape: tuple[tuple[int, int], ...] | None = None
    """(utilization %, score 0..10) points of VolumeBinding's score; None is the release's
    default (:data:`DEFAULT_VOLUME_SHAPE` from 1.37, no score before)."""

    def __post_init__(self) -> None:
        """kube's ``validateFunctionShape``."""
        if self.shape is None:
            return
        if not self.shape:
            raise ValueError("VolumeBinding.shape: at least one point must be specified")
        for (before, _), (after, _) in zip(self.shape, self.shape[1:], strict=False):
            if before >= after:
                raise ValueError("VolumeBinding.shape: utilizations must increase")
        for utilization, score in self.shape:
            if not 0 <= utilization <= 100:
                raise ValueError(f"VolumeBinding.shape: utilization {utilization} not in 0..100")
            if not 0 <= score <= MAX_SHAPE_SCORE:
                raise ValueError(f"VolumeBinding.shape: score {score} not in 0..{MAX_SHAPE_SCORE}")


class GpuAlignment(StrEnum):
    """How hard a pod asks for its devices to sit together (``lattice.dev/gpu-alignment``)."""

    STRICT = "strict"
    """The tightest domain the node's hardware offers for the request: one PCIe switch when
    some switch holds that many GPUs (and the NICs), else one NUMA node; nodes that cannot
    hold the request on one NUMA node at all do not fit."""
    NUMA = "numa"
    """One NUMA node (what a kubelet with topology policy single-numa-node admits)."""
    PREFERRED = "preferred"
    """Any node with enough free devices; alignment is only scored."""


@dataclass(frozen=True, slots=True)
class TopologyArgs:
    gpu_resource: str = GPU_RESOURCE
    """Extended resource of GPUs; must match the agent's ``--gpu-resource``."""
    rdma_resource: str = RDMA_RESOURCE
    """Extended resource of RDMA NICs (one unit per NIC); the agent's ``--rdma-resource``."""
    default_alignment: GpuAlignment = GpuAlignment.PREFERRED
    """Alignment of pods that do not carry the annotation."""


class LoadScoreMode(StrEnum):
    LEAST_LOADED = "LeastLoaded"
    """Prefer the node with the lowest predicted utilisation after the pod (spreading)."""
    TARGET_PACKING = "TargetPacking"
    """Fill nodes up to a target utilisation, then prefer nodes still below it (Trimaran's
    TargetLoadPacking): fewer, busier nodes with headroom for spikes."""


@dataclass(frozen=True, slots=True)
class LoadAwareArgs:
    mode: LoadScoreMode = LoadScoreMode.LEAST_LOADED
    predict: PredictConfig = field(default_factory=PredictConfig)
    """Smoothing, staleness, in-flight estimates, thresholds (filter) and resource weights
    and targets (score); the controller hands the same config to its predictor."""


class GpuPolicy(StrEnum):
    """How GPU pods choose among nodes (``LatticeScheduler.spec.gpuPlacement.policy``)."""

    FRAGMENTATION = "Fragmentation"
    """The node whose free GPUs stay most usable by the request sizes the cluster sees
    (fragmentation gradient, after FGD, USENIX ATC'23): best fit, judged by demand."""
    MOST_ALLOCATED = "MostAllocated"
    """The node with the highest share of its GPUs requested afterwards (plain best fit)."""
    LEAST_ALLOCATED = "LeastAllocated"
    """The node with the most free GPUs afterwards (spreading, kube's default for cpu)."""


GPU_RESOURCES: Final = ("nvidia.com/gpu", "amd.com/gpu")
"""Extended resources counted as GPUs unless the profile lists others."""


@dataclass(frozen=True, slots=True)
class GpuPlacementArgs:
    policy: GpuPolicy = GpuPolicy.FRAGMENTATION
    resources: tuple[str, ...] = GPU_RESOURCES
    """Extended resources that are whole GPUs; a pod's GPU count is the sum of its requests
    of them (a node normally offers one kind)."""

    def __post_init__(self) -> None:
        if not self.resources:
            raise ValueError("GPUPlacement.resources: at least one GPU resource is needed")
        if len(set(self.resources)) != len(self.resources):
            raise ValueError("GPUPlacement.resources: duplicate resource names")


UNSUPPORTED: Final = "Unsupported"
NODE_UNSCHEDULABLE: Final = "NodeUnschedulable"
NODE_NAME: Final = "NodeName"
TAINT_TOLERATION: Final = "TaintToleration"
NODE_AFFINITY: Final = "NodeAffinity"
NODE_PORTS: Final = "NodePorts"
NODE_RESOURCES_FIT: Final = "NodeResourcesFit"
VOLUME_RESTRICTIONS: Final = "VolumeRestrictions"
NODE_VOLUME_LIMITS: Final = "NodeVolumeLimits"
VOLUME_BINDING: Final = "VolumeBinding"
VOLUME_ZONE: Final = "VolumeZone"
POD_TOPOLOGY_SPREAD: Final = "PodTopologySpread"
INTER_POD_AFFINITY: Final = "InterPodAffinity"
DYNAMIC_RESOURCES: Final = "DynamicResources"
BALANCED_ALLOCATION: Final = "NodeResourcesBalancedAllocation"
TOPOLOGY: Final = "Topology"
LOAD_AWARE: Final = "LoadAware"
GPU_PLACEMENT: Final = "GPUPlacement"
NODE_DECLARED_FEATURES: Final = "NodeDeclaredFeatures"
CAPACITY_SCHEDULING: Final = "CapacityScheduling"

DEFAULT_FILTERS: Final = (
    UNSUPPORTED,
    CAPACITY_SCHEDULING,
    NODE_UNSCHEDULABLE,
    NODE_NAME,
    TAINT_TOLERATION,
    NODE_AFFINITY,
    NODE_PORTS,
    NODE_RESOURCES_FIT,
    VOLUME_RESTRICTIONS,
    NODE_VOLUME_LIMITS,
    VOLUME_BINDING,
    VOLUME_ZONE,
    POD_TOPOLOGY_SPREAD,
    INTER_POD_AFFINITY,
    DYNAMIC_RESOURCES,
    NODE_DECLARED_FEATURES,
    TOPOLOGY,
    LOAD_AWARE,
)
DEFAULT_SCORES: Final = (
    (TAINT_TOLERATION, 3),
    (NODE_AFFINITY, 2),
    (NODE_RESOURCES_FIT, 1),
    (VOLUME_BINDING, 1),
    (POD_TOPOLOGY_SPREAD, 2),
    (INTER_POD_AFFINITY, 2),
    (DYNAMIC_RESOURCES, 2),
    (BALANCED_ALLOCATION, 1),
    (TOPOLOGY, 5),
    (LOAD_AWARE, 3),
    (GPU_PLACEMENT, 5),
)
"""kube-scheduler's weights, in its order; DynamicResources scores (prioritized lists) with
weight 2 since 1.35 (kubernetes#134711, ``default_plugins.go``), so in every supported release.

LoadAware's weight 3 lets a 20-point load difference (a node at 70 % against one at 50 %)
outweigh the requests-based scores (NodeResourcesFit and BalancedAllocation, weight 1 each),
which cannot see load placed by others: diluting the load score is how load-aware schedulers
end up placing on hot nodes.

VolumeBinding is in kube's default profile without a weight, which kube takes as 1; it
scores only from 1.37 (StorageCapacityScoring) and skips every pod before.

GPUPlacement's weight 5 puts a GPU pod's node choice first (its best node leads the next by
250 points: more than LeastAllocated and BalancedAllocation together, and more than any one
preferred node affinity, pod affinity or spread at weight 2; see ``_ranked_by`` in
``plugins/gpu_placement.py``), level with device alignment (Topology), which it never
contradicts: both fill partly used hardware first."""

LATTICE_PLUGINS: Final = frozenset({CAPACITY_SCHEDULING, TOPOLOGY, LOAD_AWARE, GPU_PLACEMENT})
"""Lattice's own plugins (and scheduler-plugins' CapacityScheduling, which kube-scheduler
does not ship); without them a profile is kube-scheduler's."""


@dataclass(frozen=True, slots=True)
class DynamicResourcesArgs:
    node_selector: LabelSelector = EVERYTHING
    """Nodes whose devices Lattice may allocate (``spec.dra.nodeSelector``): the API server
    does not stop two schedulers taking one device, and neither sees the other's in-flight
    allocations, so an operator running kube-scheduler's DRA pods beside Lattice's gives
    each its own nodes. Claims allocated already are honoured on any node."""
    search_budget: float = SEARCH_BUDGET
    """Seconds of device search one attempt may take over all its nodes
    (``spec.dra.searchBudgetSeconds``; :mod:`scheduler.core.dra.search`)."""
    binding_timeout: float = BINDING_TIMEOUT
    """Seconds PreBind waits for a device's binding conditions, from the allocation
    (kube's ``DynamicResourcesArgs.bindingTimeout``, 600 s by default;
    ``spec.dra.bindingTimeoutSeconds``; :mod:`scheduler.core.dra.binding`)."""


@dataclass(frozen=True, slots=True)
class Profile:
    """A typed scheduling profile (hashable, so frameworks can be cached per profile)."""

    name: str = "lattice"
    filters: tuple[str, ...] = DEFAULT_FILTERS
    """Filter plugins in execution order; their PreFilter runs in the same order."""
    scores: tuple[tuple[str, int], ...] = DEFAULT_SCORES
    """Score plugins and integer weights."""
    node_resources_fit: NodeResourcesFitArgs = field(default_factory=NodeResourcesFitArgs)
    balanced_allocation: BalancedAllocationArgs = field(default_factory=BalancedAllocationArgs)
    inter_pod_affinity: InterPodAffinityArgs = field(default_factory=InterPodAffinityArgs)
    topology: TopologyArgs = field(default_factory=TopologyArgs)
    load_aware: LoadAwareArgs = field(default_factory=LoadAwareArgs)
    gpu_placement: GpuPlacementArgs = field(default_factory=GpuPlacementArgs)
    dynamic_resources: DynamicResourcesArgs = field(default_factory=DynamicResourcesArgs)
    volume_binding: VolumeBindingArgs = field(default_factory=VolumeBindingArgs)
    domain_levels: tuple[str, ...] = ()
    """The network levels (``spec.topology.levels``, widest first): a GPU pod's tie between
    equally scored nodes goes to those that break no whole domain
    (:mod:`scheduler.core.whole_domains`). Set by the scheduler from its settings."""
    kube_minor: int = DEFAULT_KUBE_MINOR
    """The Kubernetes 1.x release whose kube-scheduler this profile mirrors. Plugins whose
    behaviour changed between releases (BalancedAllocation in 1.36; VolumeBinding's score
    and NodeVolumeLimits' missing-driver check in 1.37) follow it, so Lattice
    scores as the cluster's own kube-scheduler would."""

    def __post_init__(self) -> None:
        if (
            isinstance(self.kube_minor, bool)
            or not isinstance(self.kube_minor, int)
            or nearest_kube_minor(self.kube_minor) != self.kube_minor
        ):
            raise ValueError(
                f"profile {self.name!r}: Kubernetes 1.{self.kube_minor} is not a supported"
                f" release (1.{OLDEST_KUBE_MINOR} to 1.{NEWEST_KUBE_MINOR})"
            )
        if (
            self.volume_binding.shape is not None
            and self.kube_minor < STORAGE_CAPACITY_SCORING_SINCE
        ):
            # kube refuses the field while StorageCapacityScoring is off.
            raise ValueError(
                f"profile {self.name!r}: VolumeBinding.shape needs StorageCapacityScoring,"
                f" off in Kubernetes 1.{self.kube_minor}"
            )
        if len(set(self.filters)) != len(self.filters):
            raise ValueError(f"duplicate filter plugins in profile {self.name!r}")
        names = [n for n, _ in self.scores]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate score plugins in profile {self.name!r}")
        _check_weights(f"profile {self.name!r} scores", self.scores)


DEFAULT_PROFILE: Final = Profile()


def kube_profile(
    *,
    name: str = "kube-default",
    strategy: ScoringStrategy = ScoringStrategy.LEAST_ALLOCATED,
    resources: tuple[tuple[str, int], ...] = DEFAULT_SCORE_RESOURCES,
    kube_minor: int = DEFAULT_KUBE_MINOR,
) -> Profile:
    """kube-scheduler's default profile as the core computes it (Lattice's plugins removed),
    optionally with a NodeResourcesFit strategy of its own: the peers of `lattice simulate`."""
    return Profile(
        name=name,
        kube_minor=kube_minor,
        filters=tuple(f for f in DEFAULT_FILTERS if f not in LATTICE_PLUGINS),
        scores=tuple((s, w) for s, w in DEFAULT_SCORES if s not in LATTICE_PLUGINS),
        node_resources_fit=NodeResourcesFitArgs(strategy=strategy, resources=resources),
    )

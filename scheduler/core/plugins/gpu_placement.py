"""GPUPlacement: choose the node that keeps the cluster's free GPUs usable by big jobs.

kube-scheduler scores GPUs like cpu (LeastAllocated spreads), so a stream of 1-GPU pods
lands one per 8-GPU node and an 8-GPU job then finds no whole node. On Alibaba's GPU trace
that leaves about a quarter of the GPUs unallocated while 8-GPU jobs wait.

Policies (``GpuPlacementArgs.policy``):

* **Fragmentation** (default): rank the feasible nodes by how little the placement raises
  the node's fragmentation, i.e. its free GPUs that the cluster's request mix could not use
  afterwards (:mod:`scheduler.core.gpus`), then by fewest GPUs and cores left free (best
  fit). Judged against the sizes that actually arrive and wait, and aware that cpu or
  memory taken beside free GPUs strands them. Pods without GPUs are ranked too, by the
  fragmentation they cause, then by fewest free GPUs on the node (the cpu of a node whose
  GPUs are all taken serves nobody else), but only where some feasible node has free GPUs:
  elsewhere the plugin skips, and among nodes with as many free GPUs the order is kube's,
  so such pods keep kube-scheduler's scoring on clusters (or parts) without free GPUs.
* **MostAllocated**: the share of the node's GPUs requested afterwards (plain best fit).
* **LeastAllocated**: the share left free (spreading, as kube-scheduler does).

The last two score only pods that ask for GPUs.

**DRA claims** (kube 1.35-1.37 scores only which ``firstAvailable`` alternative a node
offers, nothing of where the devices sit): a pod whose claims get new devices is ranked
first by that preference, then by where its allocation would sit
(:func:`~scheduler.core.plugins.dynamic_resources.device_fits`). Fragmentation: the
preference, then not breaking into an untouched node (pools with no device in use), then
fewest PCIe roots spanned, then fewest free devices left on those roots (fill a partly
used root first), then fewest left in the pools drawn from on the node (fill a partly used
node); MostAllocated: the preference, then the last only; LeastAllocated: no DRA score of
its own (kube's alone). Whole nodes come before alignment because a claim that asked for
no common root loses little across two, while an 8-device claim needs a whole node: with
roots first, bench-dra's stream left 113 of 1000 nodes whole against kube-scheduler 1.37's
144-149 (kube packs by accident: BalancedAllocation's 1.36 formula, truncated, gives a
node with 1-8 small pods one point over an empty one). A claim that must share a root
says so with ``matchAttribute``, which the allocator enforces. Scores are
normalised over the feasible nodes (best 100, worst 0; Fragmentation by rank, halving per
step), so the profile weight decides how GPU placement trades against the other scores.
``lattice explain`` shows the same per-node figures (:meth:`GpuPlacement.figures`).

How this combines with kube's DynamicResources score (weight 2, left exactly as kube's so
that the profile without Lattice's plugins scores as kube-scheduler): the preference is
kube's raw per-node value (:func:`~scheduler.core.plugins.dynamic_resources.
prioritized_list_scores`, ``8 - index`` per request), so both plugins point the same way
and never contradict. Without the preference key, fit would favour the node where a pod
gets its smaller fallback on a partly used root (fewer devices, fewer roots) over a free
node offering its first choice, and weight 5 on a halving rank outvotes kube's mild
100-against-87 for the first choice; with it, packing only decides among nodes offering the
same alternatives. There kube's score is equal on every node (100, or skipped when no
request is a prioritized list), so packing alone decides, as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import numpy as np

from scheduler.core.framework import Cycle
from scheduler.core.gpus import Figures, GpuDemand, figures, gpu_count
from scheduler.core.plugins._normalize import MAX_NODE_SCORE
from scheduler.core.plugins.dynamic_resources import device_fits, prioritized_list_scores
from scheduler.core.plugins.topology import NEUTRAL_SCORE
from scheduler.core.profile import GPU_PLACEMENT, TOPOLOGY, GpuPlacementArgs, GpuPolicy, Profile
from scheduler.core.snapshot import BoolArray, IntArray

NAME: Final = GPU_PLACEMENT


class GpuPlacement:
    name: Final = NAME

    def __init__(self, args: GpuPlacementArgs) -> None:
        self.args = args
        self._prior = GpuDemand(args.resources)
        """The mix when the cycle has no controller state (a bare core call): the prior."""

    def demand(self, cycle: Cycle) -> GpuDemand:
        return cycle.topology.gpu_demand if cycle.topology is not None else self._prior

    def figures(self, cycle: Cycle) -> Figures:
        """This pod's GPU figures per node (explain shows the same numbers)."""
        classes = (
            self.demand(cycle).classes(cycle.pod)
            if self.args.policy is GpuPolicy.FRAGMENTATION
            else ()
        )
        return figures(cycle.snapshot, cycle.pod, self.args.resources, classes)

    def score(self, cycle: Cycle, feasible: BoolArray) -> IntArray | None:
        policy = self.args.policy
        if policy is not GpuPolicy.LEAST_ALLOCATED:
            dra = self._dra_keys(cycle)
            if dra:
                keys = dra if policy is GpuPolicy.FRAGMENTATION else (dra[0], dra[-1])
                return _ranked_by(keys, feasible)
        if policy is not GpuPolicy.FRAGMENTATION and not gpu_count(
            cycle.pod.resources.requests, self.args.resources
        ):
            return None
        if not _any_gpu_capacity(cycle, self.args.resources, feasible):
            # Before the figures, which cost most of a plain pod's cycle on a cluster
            # without GPUs: no feasible GPU node, nothing to keep placeable.
            return None
        fig = self.figures(cycle)
        capacity = fig.free.capacity
        raw: IntArray
        if policy is GpuPolicy.FRAGMENTATION:
            # Lexicographic: fragmentation first (in hundredths of a GPU: finer differences
            # are noise of the learned mix), then fewest GPUs left free (best fit), which
            # breaks the ties the measure leaves (with mostly 1-GPU requests, 7, 6 and 5
            # free GPUs are equally fragmented; spreading over them is what strands 8s).
            gain = np.floor_divide(fig.gain_milli, 10)
            if fig.gpus:
                left = np.clip(fig.after.gpus, 0, None)
                cores = np.clip(fig.after.cpu // 1000, 0, None)
                return _ranked_by((*self._alignment(cycle), gain, -left, -cores), feasible)
            # A pod without GPUs: off free GPUs first (the cpu of a node whose GPUs are all
            # taken serves nobody else); among nodes with as many free GPUs, kube's scores.
            return _ranked_by((gain, -np.clip(fig.free.gpus, 0, None)), feasible)
        else:
            remaining = np.maximum(fig.after.gpus, 0)
            share = remaining if policy is GpuPolicy.LEAST_ALLOCATED else capacity - remaining
            raw = np.where(capacity > 0, share * MAX_NODE_SCORE // np.maximum(capacity, 1), 0)
        values = raw[feasible]
        lo, hi = int(values.min()), int(values.max())
        if lo == hi:
            return None  # every feasible node is alike to this plugin
        scores: IntArray = (np.clip(raw, lo, hi) - lo) * MAX_NODE_SCORE // (hi - lo)
        return scores

    def _dra_keys(self, cycle: Cycle) -> tuple[IntArray, ...]:
        """The prioritized-list preference, then minus (opens untouched pools, roots
        spanned, free left on them, free left in the pools) per row (larger ranks first),
        for a pod whose claims allocate devices; rows without one rank last."""
        fits = device_fits(cycle)
        if not fits:
            return ()
        preference = prioritized_list_scores(cycle)
        worst = np.iinfo(np.int64).min
        keys = tuple(np.full(cycle.num_nodes, worst, dtype=np.int64) for _ in range(5))
        for row, fit in fits.items():
            keys[0][row], keys[1][row], keys[2][row], keys[3][row], keys[4][row] = (
                0 if preference is None else int(preference[row]),
                -int(fit.opens),
                -fit.roots,
                -fit.left_on_roots,
                -fit.left_in_pools,
            )
        return keys

    def _alignment(self, cycle: Cycle) -> tuple[IntArray, ...]:
        """Topology's score of its device choice per node, when it made any: alignment
        comes first, so fragmentation never sends a job to split devices (nodes without a
        report score Topology's neutral)."""
        state = cycle.state.get(TOPOLOGY)
        placements = getattr(state, "placements", None)
        if not placements:
            return ()
        align = np.full(cycle.num_nodes, NEUTRAL_SCORE, dtype=np.int64)
        for row, placement in placements.items():
            align[row] = placement.score
        return (align,)


def _ranked_by(keys: tuple[IntArray, ...], feasible: BoolArray) -> IntArray | None:
    """Scores by rank of the lexicographic key (first array first) among the distinct keys
    of the feasible rows: the best 100, the next 50, then 25, and so on, so a tie-breaker
    is never lost in the range of the criterion before it. At the default weight 5 the best
    node leads the next by 250 points: more than the cpu-spreading scores together
    (LeastAllocated and BalancedAllocation, 200 at most; they would scatter GPU pods over
    partly used nodes), and so also more than one preferred node affinity, preferred pod
    (anti-)affinity or topology spread alone (weight 2: 200). Those outvote the best node
    only with help (two of them, or with cpu spreading leaning their way by over 50); a
    PreferNoSchedule taint (weight 3: 300) or LoadAware's load score (up to 300) can alone.
    A pod whose preference must win asks for it as required affinity; a profile whose
    preferences should rule GPU placement sets the weight to 3 or less (a lead of 150)."""
    rows = np.flatnonzero(feasible)
    stacked = np.stack([k[rows] for k in keys], axis=1)
    distinct, inverse = np.unique(stacked, axis=0, return_inverse=True)
    if len(distinct) < 2:
        return None
    below = len(distinct) - 1 - inverse.reshape(-1)
    scores = np.zeros(len(feasible), dtype=np.int64)
    scores[rows] = np.right_shift(MAX_NODE_SCORE, np.minimum(below, 62))
    return scores


def new(profile: Profile) -> GpuPlacement:
    return GpuPlacement(profile.gpu_placement)


def _any_gpu_capacity(cycle: Cycle, resources: Iterable[str], feasible: BoolArray) -> bool:
    """Whether a feasible row has allocatable GPUs (the check :func:`figures` would make)."""
    snapshot = cycle.snapshot
    alloc = snapshot.allocatable
    for resource in resources:
        col = snapshot.resource_column(resource)
        if col is not None and (alloc[col][feasible] > 0).any():
            return True
    return False

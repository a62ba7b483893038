"""GPUPlacement: choose the node that keeps the cluster's free GPUs usable by big jobs.

kube-scheduler scores GPUs like cpu (LeastAllocated spreads), so a stream of 1-GPU pods
lands one per 8-GPU node and an 8-GPU job then finds no whole node. On Alibaba's GPU trace
that leaves about a quarter of the GPUs unallocated while 8-GPU jobs wait.

Policies (``GpuPlacementArgs.policy``):

* **Fragmentation** (default): score each feasible node by how little the placement raises
  the node's fragmentation, i.e. its free GPUs that the cluster's request mix could not use
  afterwards (:mod:`scheduler.core.gpus`). Best fit by count, judged against the sizes that
  actually arrive and wait, and aware that cpu or memory taken beside free GPUs strands
  them. It scores CPU-only pods too, but only where it sees a difference: on a cluster where
  no placement of the pod changes any node's fragmentation (no GPU nodes, or GPU nodes with
  room to spare) it skips, so such pods keep kube-scheduler's scoring exactly.
* **MostAllocated**: the share of the node's GPUs requested afterwards (plain best fit).
* **LeastAllocated**: the share left free (spreading, as kube-scheduler does).

The last two score only pods that ask for GPUs. Scores are normalised over the feasible
nodes (best 100, worst 0), so the profile weight decides how GPU placement trades against
the other scores. ``lattice explain`` shows the same per-node figures
(:meth:`GpuPlacement.figures`).
"""

from __future__ import annotations

from typing import Final

import numpy as np

from scheduler.core.framework import Cycle
from scheduler.core.gpus import Figures, GpuDemand, figures, gpu_count
from scheduler.core.plugins._normalize import MAX_NODE_SCORE
from scheduler.core.profile import GPU_PLACEMENT, GpuPlacementArgs, GpuPolicy, Profile
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
            self.demand(cycle).classes() if self.args.policy is GpuPolicy.FRAGMENTATION else ()
        )
        return figures(cycle.snapshot, cycle.pod, self.args.resources, classes)

    def score(self, cycle: Cycle, feasible: BoolArray) -> IntArray | None:
        policy = self.args.policy
        if policy is not GpuPolicy.FRAGMENTATION and not gpu_count(
            cycle.pod.resources.requests, self.args.resources
        ):
            return None
        fig = self.figures(cycle)
        capacity = fig.free.capacity
        if not (capacity[feasible] > 0).any():
            return None  # no feasible GPU node: nothing to keep placeable
        raw: IntArray
        if policy is GpuPolicy.FRAGMENTATION:
            raw = fig.gain_milli
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


def new(profile: Profile) -> GpuPlacement:
    return GpuPlacement(profile.gpu_placement)

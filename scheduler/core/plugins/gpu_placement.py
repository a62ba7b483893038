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
the other scores. The per-node figures are kept in the cycle for ``lattice explain``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from scheduler.core.framework import Cycle
from scheduler.core.gpus import Free, GpuDemand, SizeClass, fragmentation, gpu_count
from scheduler.core.plugins._normalize import MAX_NODE_SCORE
from scheduler.core.profile import GPU_PLACEMENT, GpuPlacementArgs, GpuPolicy, Profile
from scheduler.core.snapshot import BoolArray, IntArray
from scheduler.model.names import CPU, MEMORY

NAME: Final = GPU_PLACEMENT
_MILLI: Final = 1000
"""Fragmentation is compared in thousandths of a GPU: integer scores, stable ties."""


@dataclass(frozen=True, slots=True)
class Figures:
    """What the score was computed from, per node row (for explanations)."""

    policy: GpuPolicy
    gpus: int
    """GPUs the pod asks."""
    free: IntArray
    """Free GPUs before the pod."""
    capacity: IntArray
    before: IntArray
    """Fragmentation before, in thousandths of a GPU (Fragmentation policy; else zeros)."""
    after: IntArray
    classes: tuple[SizeClass, ...]


class GpuPlacement:
    name: Final = NAME

    def __init__(self, args: GpuPlacementArgs) -> None:
        self.args = args
        self._prior = GpuDemand(args.resources)

    def score(self, cycle: Cycle, feasible: BoolArray) -> IntArray | None:
        requests = cycle.pod.resources.requests
        gpus = gpu_count(requests, self.args.resources)
        policy = self.args.policy
        if gpus == 0 and policy is not GpuPolicy.FRAGMENTATION:
            return None
        free = Free.of(cycle.snapshot, self.args.resources)
        if not (free.capacity[feasible] > 0).any():
            return None  # no feasible GPU node: nothing to keep placeable
        after = free.minus(gpus, requests.get(CPU, 0), requests.get(MEMORY, 0))
        zeros = np.zeros(cycle.num_nodes, dtype=np.int64)
        classes: tuple[SizeClass, ...] = ()
        if policy is GpuPolicy.FRAGMENTATION:
            demand = cycle.topology.gpu_demand if cycle.topology is not None else self._prior
            classes = demand.classes()
            before_f = np.rint(fragmentation(free, classes) * _MILLI).astype(np.int64)
            after_f = np.rint(fragmentation(after, classes) * _MILLI).astype(np.int64)
            raw = before_f - after_f  # higher is better: the placement fragments less
            cycle.state[NAME] = Figures(
                policy, gpus, free.gpus, free.capacity, before_f, after_f, classes
            )
        else:
            capacity = np.maximum(free.capacity, 1)
            remaining = np.maximum(after.gpus, 0)
            if policy is GpuPolicy.MOST_ALLOCATED:
                raw = (free.capacity - remaining) * MAX_NODE_SCORE // capacity
            else:
                raw = remaining * MAX_NODE_SCORE // capacity
            raw = np.where(free.capacity > 0, raw, 0)
            cycle.state[NAME] = Figures(policy, gpus, free.gpus, free.capacity, zeros, zeros, ())
        values = raw[feasible]
        lo, hi = int(values.min()), int(values.max())
        if lo == hi:
            return None  # every feasible node is alike to this plugin
        scores: IntArray = (np.clip(raw, lo, hi) - lo) * MAX_NODE_SCORE // (hi - lo)
        return scores


def new(profile: Profile) -> GpuPlacement:
    return GpuPlacement(profile.gpu_placement)

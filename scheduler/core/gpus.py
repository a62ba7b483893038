"""GPU demand and fragmentation: which free GPUs the cluster's requests can still use.

Theory of operation (after FGD, Weng et al., USENIX ATC'23, for whole GPUs):

* :class:`GpuDemand` learns the mix of GPU request sizes the cluster sees. Every arriving
  pod that asks for GPUs moves an exponentially weighted share towards its size class (1, 2,
  4, 8, or whatever sizes arrive), and each class keeps the typical cpu and memory its pods
  ask beside their GPUs, and the largest cpu and memory among its last :data:`RECENT` pods
  (at the share of one of them), so a rare large shape that only a few nodes can take is
  part of the mix. Pods still pending count too: a class that waits is a class the cluster
  is short of; the pod being placed is left out of the mix it is judged by (it is not its
  own competition). Before anything arrives the prior is 1/2/4/8 in equal shares.
* The **fragmentation** of a node is the expected number of its free GPUs that a request
  drawn from that mix could *not* use: all of them for a size larger than the free count,
  and all of them when the node's free cpu or memory is below what that size typically
  brings (a GPU with no CPU beside it is stranded too). Each class weighs by its share per
  node that can still take it (its demand pressure), so the only nodes that can hold a
  class count its loss as the loss of a scarce home, not one among hundreds.
* A placement is judged by how much it raises the node's fragmentation (the fragmentation
  gradient): a 1-GPU pod on a whole free 8-GPU node makes seven GPUs useless to 8-GPU
  requests; on a node with one GPU left it makes nothing worse.

Shares are floats (they are a prediction); capacities stay exact integers. Pure: the
controller feeds arrivals and pending pods, the core reads the mix.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from scheduler.core.profile import GPU_RESOURCES
from scheduler.core.snapshot import BoolArray, IntArray, Snapshot
from scheduler.model.names import CPU, MEMORY
from scheduler.model.pod import Pod

FloatArray = npt.NDArray[np.float64]

PRIOR_SIZES: Final = (1, 2, 4, 8)
"""The size classes assumed before any GPU pod arrives (equal shares)."""
ARRIVAL_ALPHA: Final = 0.01
"""Share moved per arrival: the mix reflects roughly the last few hundred GPU pods."""
REQUEST_ALPHA: Final = 0.05
"""Smoothing of a class's typical cpu and memory request."""
RECENT: Final = 64
"""Pods per class whose largest cpu and memory the mix keeps beside the typical ones."""
PENDING_SHARE: Final = 0.5
"""Weight of the pending pods' sizes in the mix while some GPU pods are pending."""
_MIN_SHARE: Final = 1e-4


@dataclass(frozen=True, slots=True)
class SizeClass:
    """One request size of the mix."""

    gpus: int
    share: float
    """Probability that a GPU request is of this size (the shares sum to 1)."""
    cpu_milli: int
    """Typical cpu (millicores) a pod of this size asks beside its GPUs."""
    memory: int
    """Typical memory (bytes) a pod of this size asks."""
    seen: bool = True
    """Some pod of this size arrived (False: a class of the prior, requests unknown)."""


def gpu_count(requests: Mapping[str, int], resources: Iterable[str]) -> int:
    """Whole GPUs asked: the sum of the GPU resources' requests."""
    return sum(requests.get(r, 0) for r in resources)


class GpuDemand:
    """The request mix, learned online (see the module docstring)."""

    def __init__(self, resources: Iterable[str] | None = None) -> None:
        self.resources: tuple[str, ...] = tuple(resources or GPU_RESOURCES)
        self._shares: dict[int, float] = {k: 1.0 / len(PRIOR_SIZES) for k in PRIOR_SIZES}
        self._cpu: dict[int, float] = {}
        self._memory: dict[int, float] = {}
        self._pending: dict[str, int] = {}
        self._pending_counts: dict[int, int] = {}
        self._recent: dict[int, deque[tuple[int, int]]] = {}
        self._largest: dict[int, tuple[int, int]] = {}
        self._arrivals = 0
        self._classes: tuple[SizeClass, ...] | None = None

    @property
    def arrivals(self) -> int:
        """GPU pods observed so far."""
        return self._arrivals

    def set_resources(self, resources: Iterable[str]) -> None:
        """The profile's GPU resources changed (new arrivals are counted by these)."""
        self.resources = tuple(resources)

    def gpus_of(self, pod: Pod) -> int:
        return gpu_count(pod.resources.requests, self.resources)

    def observe(self, pod: Pod) -> None:
        """A pod arrived (call once per pod); pods without GPUs do not change the mix."""
        gpus = self.gpus_of(pod)
        if gpus <= 0:
            return
        requests = pod.resources.requests
        self._arrivals += 1
        for k in list(self._shares):
            share = self._shares[k] * (1.0 - ARRIVAL_ALPHA)
            if share < _MIN_SHARE and k != gpus:
                del self._shares[k]
            else:
                self._shares[k] = share
        self._shares[gpus] = self._shares.get(gpus, 0.0) + ARRIVAL_ALPHA
        for typical, amount in (
            (self._cpu, requests.get(CPU, 0)),
            (self._memory, requests.get(MEMORY, 0)),
        ):
            old = typical.get(gpus)
            typical[gpus] = float(amount) if old is None else old + REQUEST_ALPHA * (amount - old)
        recent = self._recent.setdefault(gpus, deque(maxlen=RECENT))
        recent.append((requests.get(CPU, 0), requests.get(MEMORY, 0)))
        self._largest[gpus] = (max(r[0] for r in recent), max(r[1] for r in recent))
        self._classes = None

    def observe_placed(self, placed: Iterable[tuple[str, Pod]]) -> int:
        """Pods already on nodes, as arrivals in creation order: how the mix is rebuilt
        where it was not watched growing (a scheduler's start or failover, ``lattice
        explain``), so both judge by the same mix. ``placed``: (creationTimestamp, pod)
        pairs; RFC 3339 timestamps of one API server sort as strings, ties by namespace
        and name. Pods that came and went before are not seen: the rebuilt mix is the one
        the cluster's current load implies. Returns the GPU pods observed."""
        before = self._arrivals
        for _, pod in sorted(placed, key=lambda e: (e[0], e[1].namespace, e[1].name)):
            self.observe(pod)
        return self._arrivals - before

    def set_pending(self, key: str, pod: Pod | None) -> None:
        """``pod`` waits to be placed (None: it no longer does). A key seen for the first
        time is an arrival (:meth:`observe`), so a controller calls only this."""
        gpus = self.gpus_of(pod) if pod is not None else 0
        if gpus > 0:
            if key not in self._pending:
                assert pod is not None
                self.observe(pod)
            old = self._pending.get(key)
            if old != gpus:
                if old is not None:
                    self._count_pending(old, -1)
                self._pending[key] = gpus
                self._count_pending(gpus, 1)
                self._classes = None
        else:
            old = self._pending.pop(key, None)
            if old is not None:
                self._count_pending(old, -1)
                self._classes = None

    def _count_pending(self, gpus: int, delta: int) -> None:
        count = self._pending_counts.get(gpus, 0) + delta
        if count > 0:
            self._pending_counts[gpus] = count
        else:
            self._pending_counts.pop(gpus, None)

    def classes(self, without: Pod | None = None) -> tuple[SizeClass, ...]:
        """The mix, largest share first (ties: smaller size first); ``without``: a pending
        pod left out (the pod being placed)."""
        gpus = self._pending_gpus(without) if without is not None else None
        if gpus is not None:
            counts = dict(self._pending_counts)
            self._count_pending_in(counts, gpus)
            return self._compute(counts)
        if self._classes is None:
            self._classes = self._compute(self._pending_counts)
        return self._classes

    def _pending_gpus(self, pod: Pod) -> int | None:
        """The pod's entry among the pending, under either key it may have been given: the
        controller's queue key (namespace/name) or the cache's (:attr:`Pod.key`, the uid),
        which the simulator uses. (Looking up only the uid missed every live pod: the pod
        being placed stayed in its own mix.)"""
        found = self._pending.get(pod.key)
        return found if found is not None else self._pending.get(f"{pod.namespace}/{pod.name}")

    @staticmethod
    def _count_pending_in(counts: dict[int, int], gpus: int) -> None:
        if counts[gpus] > 1:
            counts[gpus] -= 1
        else:
            del counts[gpus]

    def _compute(self, counts: Mapping[int, int]) -> tuple[SizeClass, ...]:
        total = sum(self._shares.values())
        mix = {k: v / total for k, v in self._shares.items()}
        if counts:
            n = sum(counts.values())
            mix = {k: (1 - PENDING_SHARE) * mix.get(k, 0.0) for k in mix | dict(counts)}
            for k, c in counts.items():
                mix[k] += PENDING_SHARE * c / n
        shapes: dict[tuple[int, int, int], float] = {}
        for k, share in mix.items():
            if share <= 0:
                continue
            typical = (k, round(self._cpu.get(k, 0.0)), round(self._memory.get(k, 0.0)))
            recent = self._recent.get(k)
            largest = self._largest.get(k)
            if recent and largest is not None:
                rare = share / len(recent)
                shapes[(k, *largest)] = shapes.get((k, *largest), 0.0) + rare
                share -= rare
            shapes[typical] = shapes.get(typical, 0.0) + share
        out = [
            SizeClass(k, share, cpu, memory, k in self._cpu)
            for (k, cpu, memory), share in shapes.items()
        ]
        return tuple(sorted(out, key=lambda c: (-c.share, c.gpus, c.cpu_milli, c.memory)))


@dataclass(frozen=True, slots=True)
class Free:
    """Free GPUs, cpu and memory per node row (exact integers)."""

    gpus: IntArray
    cpu: IntArray
    memory: IntArray
    capacity: IntArray
    """Allocatable GPUs per node row."""

    @classmethod
    def of(cls, snapshot: Snapshot, resources: Iterable[str]) -> Free:
        n = snapshot.num_nodes
        alloc, requested = snapshot.allocatable, snapshot.requested
        gpus = np.zeros(n, dtype=np.int64)
        capacity = np.zeros(n, dtype=np.int64)
        for resource in resources:
            col = snapshot.resource_column(resource)
            if col is not None:
                gpus += alloc[col] - requested[col]
                capacity += alloc[col]

        def free(name: str) -> IntArray:
            col = snapshot.resource_column(name)
            if col is None:
                return np.zeros(n, dtype=np.int64)
            out: IntArray = alloc[col] - requested[col]
            return out

        return cls(np.maximum(gpus, 0), free(CPU), free(MEMORY), capacity)

    def minus(self, gpus: int, cpu: int, memory: int) -> Free:
        """What is free after a pod with these requests lands on each node."""
        return Free(self.gpus - gpus, self.cpu - cpu, self.memory - memory, self.capacity)


@dataclass(frozen=True, slots=True)
class Figures:
    """One pod's view of every node row's GPUs: what GPUPlacement scores and explain shows."""

    gpus: int
    """GPUs the pod asks."""
    free: Free
    """Before the pod."""
    after: Free
    classes: tuple[SizeClass, ...]
    before_milli: IntArray
    """Fragmentation before the pod, in thousandths of a GPU (integers: stable ties)."""
    after_milli: IntArray

    @property
    def gain_milli(self) -> IntArray:
        """How much less fragmented the node is with the pod (negative: more)."""
        out: IntArray = self.before_milli - self.after_milli
        return out


def figures(
    snapshot: Snapshot, pod: Pod, resources: Iterable[str], classes: tuple[SizeClass, ...]
) -> Figures:
    resources = tuple(resources)
    requests = pod.resources.requests
    gpus = gpu_count(requests, resources)
    free = Free.of(snapshot, resources)
    after = free.minus(gpus, requests.get(CPU, 0), requests.get(MEMORY, 0))

    before, classes = _pressured(free, classes)

    def milli(f: FloatArray) -> IntArray:
        out: IntArray = np.rint(f * 1000).astype(np.int64)
        return out

    return Figures(gpus, free, after, classes, milli(before), milli(fragmentation(after, classes)))


def _pressured(
    free: Free, classes: tuple[SizeClass, ...]
) -> tuple[FloatArray, tuple[SizeClass, ...]]:
    """The mix reweighted by demand pressure (each class's share divided by the nodes whose
    free GPUs, cpu and memory could take it now, at least one; renormalised to sum to 1),
    and the fragmentation of ``free`` under it."""
    gpus = np.maximum(free.gpus, 0)
    unusable = [
        (gpus < c.gpus) | (free.cpu < c.cpu_milli) | (free.memory < c.memory) for c in classes
    ]
    pressure = [
        c.share / max(len(gpus) - int(np.count_nonzero(u)), 1)
        for c, u in zip(classes, unusable, strict=True)
    ]
    total = sum(pressure)
    if total > 0:
        classes = tuple(
            SizeClass(c.gpus, p / total, c.cpu_milli, c.memory, c.seen)
            for c, p in zip(classes, pressure, strict=True)
        )
    out = np.zeros(len(gpus), dtype=np.float64)
    for c, u in zip(classes, unusable, strict=True):
        out += np.where(u, gpus * c.share, 0.0)
    return out, classes


def fragmentation(free: Free, classes: Iterable[SizeClass]) -> FloatArray:
    """Expected free GPUs per node that a request drawn from ``classes`` cannot use."""
    gpus = np.maximum(free.gpus, 0)
    out = np.zeros(len(gpus), dtype=np.float64)
    for c in classes:
        unusable: BoolArray = (gpus < c.gpus) | (free.cpu < c.cpu_milli) | (free.memory < c.memory)
        out += np.where(unusable, gpus * c.share, 0.0)
    return out


def stranded(free: Free, classes: Iterable[SizeClass]) -> IntArray:
    """Free GPUs per node that no size of the mix can use at all (neither by count nor by
    the cpu and memory beside them). Only sizes that arrived count once some have: the
    prior's classes know no cpu or memory, so they would call every GPU usable."""
    classes = tuple(classes)
    seen = tuple(c for c in classes if c.seen)
    gpus = np.maximum(free.gpus, 0)
    usable = np.zeros(len(gpus), dtype=np.bool_)
    for c in seen or classes:
        usable |= (gpus >= c.gpus) & (free.cpu >= c.cpu_milli) & (free.memory >= c.memory)
    out: IntArray = np.where(usable, 0, gpus)
    return out

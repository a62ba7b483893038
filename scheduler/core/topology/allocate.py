"""Choosing devices on one node: which GPUs, which NICs, which NUMA node.

Theory of operation
-------------------
Candidates are the k-subsets of the node's free GPUs (all of them up to
:data:`MAX_CANDIDATES`; beyond that, one greedy nearest-neighbour set grown from each free
GPU). Each candidate gets the cheapest free NICs it needs, by summed NIC-to-GPU cost, and
is described by

* its *level*: SWITCH when every device sits under one PCIe switch (a single device is
  trivially aligned), NUMA when all sit on one NUMA node, CROSS otherwise (including an
  unknown NUMA node, which cannot be proven aligned);
* its *span* (NUMA nodes touched) and *cost* (sum of pairwise device costs, see
  :mod:`scheduler.core.topology.layout`);
* its *packing*, 0..100: how full the node, the NUMA nodes and the switches it touches are
  once the pod is placed. Filling partly used domains first keeps whole switches, NUMA
  nodes and nodes free for the large pods that need them.

A candidate is admissible when its level is no worse than required and, on nodes whose
kubelet pins CPUs under the single-numa-node policy, its one NUMA node has the pinned CPUs
free. The chosen one minimises (span, cost, -packing, device indexes): alignment first,
as the kubelet's topology manager ranks NUMA affinity first, then packing, then the lowest
indexes so choices are reproducible.

Free devices come from the ledger's holdings (:func:`free_state`): recorded identities
first, then the remaining counts (unattributed pods, NUMA-only records) take the lowest
free slots, preferring the recorded NUMA node.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

import numpy as np
import numpy.typing as npt

from scheduler.core.snapshot import BoolArray, IntArray
from scheduler.core.topology.layout import NodeLayout
from scheduler.core.topology.ledger import Holding
from scheduler.core.topology.request import TopologyRequest

NODE_SHARE_WEIGHT: Final = 2
"""In packing, the node's free share counts twice: whole nodes are what the largest pods
need, and the node is the one domain every placement touches."""
MAX_CANDIDATES: Final = 20_000
"""Above this many k-subsets of free GPUs (e.g. 16 of 32), fall back to greedy candidates."""


class Level(enum.IntEnum):
    """How tightly a set of devices sits, best first."""

    SWITCH = 0
    NUMA = 1
    CROSS = 2

    @property
    def label(self) -> str:
        return ("switch", "numa", "cross-numa")[self]


@dataclass(frozen=True, slots=True, eq=False)
class FreeState:
    gpus: BoolArray
    nics: BoolArray
    cpus: IntArray
    """Whole CPUs free per NUMA zone for pinning."""
    key: tuple[bytes, bytes, bytes]
    """The state as bytes: equal states of one layout choose alike (a cache key)."""

    @classmethod
    def of(cls, gpus: BoolArray, nics: BoolArray, cpus: IntArray) -> FreeState:
        cpus = cpus.astype(np.int64)
        return cls(gpus, nics, cpus, (gpus.tobytes(), nics.tobytes(), cpus.tobytes()))


@dataclass(frozen=True, slots=True)
class Choice:
    gpus: tuple[int, ...]
    """GPU slot positions, ascending."""
    nics: tuple[int, ...]
    zone: int | None
    """Zone position holding everything aligned, when that is one NUMA node."""
    level: Level
    cost: int
    pack: int


def free_state(
    layout: NodeLayout, holdings: Iterable[Holding], allocatable_cpus: int | None = None
) -> FreeState:
    """Free GPU and NIC slots and pinnable CPUs per zone, given what placed pods hold.

    ``allocatable_cpus`` (whole CPUs of the node's allocatable) lets a NodeTopology's CPU
    counts be reduced by what the kubelet reserves, taken from the lowest NUMA nodes as the
    static CPU manager does.
    """
    gpu_free = np.ones(layout.num_gpus, dtype=np.bool_)
    nic_free = np.ones(layout.num_nics, dtype=np.bool_)
    gpu_slot = {idx: i for i, idx in enumerate(layout.gpu_index) if idx is not None}
    nic_slot = {addr: i for i, addr in enumerate(layout.nic_address) if addr is not None}
    remaining: list[tuple[int, int, int, int | None]] = []
    for holding in holdings:
        a = holding.assignment
        zone = layout.zone_position(a.numa) if a is not None and a.numa is not None else None
        gpus_marked = nics_marked = 0
        if a is not None:
            for idx in a.gpus:
                slot = gpu_slot.get(idx)
                if slot is not None and gpu_free[slot] and gpus_marked < holding.gpus:
                    gpu_free[slot] = False
                    gpus_marked += 1
            for addr in a.nics:
                nslot = nic_slot.get(addr)
                if nslot is not None and nic_free[nslot] and nics_marked < holding.nics:
                    nic_free[nslot] = False
                    nics_marked += 1
        remaining.append(
            (holding.gpus - gpus_marked, holding.nics - nics_marked, holding.cpus, zone)
        )
    cpus = layout.numa_cpus.copy()
    if not layout.cpus_net_of_reserved and allocatable_cpus is not None:
        _take_lowest(cpus, max(int(cpus.sum()) - allocatable_cpus, 0))
    unplaced_cpus = 0
    for gpus, nics, pinned, zone in remaining:
        _take_slots(gpu_free, layout.gpu_zone, gpus, zone)
        _take_slots(nic_free, layout.nic_zone, nics, zone)
        if zone is not None:
            cpus[zone] -= pinned
        else:
            unplaced_cpus += pinned
    cpus = np.maximum(cpus, 0)
    _take_lowest(cpus, unplaced_cpus)
    if layout.available_cpus is not None:
        cpus = np.minimum(cpus, layout.available_cpus)
    if layout.available_gpus is not None:
        _cap_per_zone(gpu_free, layout.gpu_zone, layout.available_gpus)
    if layout.available_nics is not None:
        _cap_per_zone(nic_free, layout.nic_zone, layout.available_nics)
    return FreeState.of(gpu_free, nic_free, cpus)


def all_free(layout: NodeLayout) -> FreeState:
    return FreeState.of(
        np.ones(layout.num_gpus, dtype=np.bool_),
        np.ones(layout.num_nics, dtype=np.bool_),
        layout.numa_cpus.copy(),
    )


def _take_lowest(amounts: IntArray, count: int) -> None:
    for z in range(len(amounts)):
        if count <= 0:
            return
        taken = min(int(amounts[z]), count)
        amounts[z] -= taken
        count -= taken


def _take_slots(free: BoolArray, zones: IntArray, count: int, zone: int | None) -> None:
    if count <= 0:
        return
    order = np.flatnonzero(free)
    if zone is not None:
        order = np.concatenate([order[zones[order] == zone], order[zones[order] != zone]])
    free[order[:count]] = False


def _cap_per_zone(free: BoolArray, zones: IntArray, available: IntArray) -> None:
    for z, cap in enumerate(available.tolist()):
        slots = np.flatnonzero(free & (zones == z))
        if len(slots) > cap:
            free[slots[max(cap, 0) :]] = False


@lru_cache(maxsize=256)
def _subsets(n: int, k: int) -> npt.NDArray[np.intp]:
    """All k-subsets of range(n) in lexicographic order, as a (C, k) array."""
    flat = np.fromiter(
        itertools.chain.from_iterable(itertools.combinations(range(n), k)),
        dtype=np.intp,
        count=math.comb(n, k) * k,
    )
    return flat.reshape(-1, k)


def _gpu_candidates(layout: NodeLayout, free: BoolArray, k: int) -> npt.NDArray[np.intp]:
    slots = np.flatnonzero(free)
    if len(slots) < k:
        return np.zeros((0, k), dtype=np.intp)
    if math.comb(len(slots), k) <= MAX_CANDIDATES:
        return slots[_subsets(len(slots), k)]
    cost = layout.gpu_cost
    seen: set[tuple[int, ...]] = set()
    out: list[tuple[int, ...]] = []
    for seed in slots.tolist():
        chosen = [seed]
        pool = [s for s in slots.tolist() if s != seed]
        while len(chosen) < k:
            best = min(pool, key=lambda s: (int(cost[s, chosen].sum()), s))
            chosen.append(best)
            pool.remove(best)
        key = tuple(sorted(chosen))
        if key not in seen:
            seen.add(key)
            out.append(key)
    return np.asarray(sorted(out), dtype=np.intp).reshape(len(out), k)


def _distinct(values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Distinct values per row of a (C, m) array (m >= 1)."""
    ordered = np.sort(values, axis=1)
    distinct: npt.NDArray[np.int64] = 1 + (np.diff(ordered, axis=1) != 0).sum(axis=1)
    return distinct


def choose(
    layout: NodeLayout,
    free: FreeState,
    request: TopologyRequest,
    required: Level,
    *,
    pin_cpus: bool,
) -> Choice | None:
    """The best admissible devices for ``request`` on this node, or None when none are.

    ``pin_cpus``: the pod's pinned CPUs must come from the NUMA node of its devices (or,
    without devices, from one NUMA node).
    """
    k, n = request.gpus, request.nics
    nic_ok = np.ones(layout.num_nics, dtype=np.bool_) if request.shared_nic else free.nics
    if k == 0:
        return _choose_without_gpus(layout, free, request, required, nic_ok, pin_cpus=pin_cpus)
    cands = _gpu_candidates(layout, free.gpus, k)
    if len(cands) == 0:
        return None
    count = len(cands)
    iu0, iu1 = np.triu_indices(k, 1)
    cost = layout.gpu_cost[cands[:, iu0], cands[:, iu1]].sum(axis=1).astype(np.int64)
    zones = layout.gpu_zone[cands]
    groups = layout.gpu_group[cands]
    nics = np.zeros((count, 0), dtype=np.intp)
    if n > 0:
        if int(nic_ok.sum()) < n:
            return None
        per_nic = layout.nic_cost[:, cands].sum(axis=2)  # (NICs, C)
        per_nic = np.where(nic_ok[:, None], per_nic, np.iinfo(np.int64).max // 4)
        nics = np.sort(np.argsort(per_nic, axis=0, kind="stable")[:n].T, axis=1)
        cost = cost + np.take_along_axis(per_nic.T, nics, axis=1).sum(axis=1)
        zones = np.concatenate([zones, layout.nic_zone[nics]], axis=1)
        groups = np.concatenate([groups, layout.nic_group[nics]], axis=1)
    unknown = (zones < 0).any(axis=1)
    span = _distinct(zones)
    single_zone = np.where((span == 1) & ~unknown, zones[:, 0], -1)
    same_switch = (_distinct(groups) == 1) & (groups[:, 0] >= 0)
    if k + n == 1:
        same_switch[:] = True
    level = np.where(same_switch, Level.SWITCH, np.where(single_zone >= 0, Level.NUMA, Level.CROSS))
    ok = level <= required
    if pin_cpus and request.cpus > 0:
        ok &= (single_zone >= 0) & (free.cpus[np.maximum(single_zone, 0)] >= request.cpus)
    if not ok.any():
        return None
    pack = _packing(layout, free.gpus, cands)
    span_key = np.where(unknown, layout.num_zones + 1, span)
    order = np.lexsort((np.arange(count), -pack, cost, span_key))
    best = int(next(i for i in order.tolist() if ok[i]))
    zone = int(single_zone[best])
    return Choice(
        gpus=tuple(int(s) for s in cands[best]),
        nics=tuple(int(s) for s in nics[best]),
        zone=zone if zone >= 0 else None,
        level=Level(int(level[best])),
        cost=int(cost[best]),
        pack=int(pack[best]),
    )


def _packing(layout: NodeLayout, free: BoolArray, cands: npt.NDArray[np.intp]) -> IntArray:
    """0..100 per candidate: 100 minus the (weighted) mean free share left in the node and
    in the NUMA nodes and switches the candidate touches."""
    count, k = cands.shape
    node_share = 100 * (int(free.sum()) - k) // max(layout.num_gpus, 1)
    shares = [np.full(count, node_share, dtype=np.int64)] * NODE_SHARE_WEIGHT
    for positions, size in (
        (layout.gpu_zone, layout.num_zones),
        (layout.gpu_group, layout.num_groups),
    ):
        if size == 0 or (positions < 0).all():
            continue
        onehot = np.zeros((count, size + 1), dtype=np.int64)
        cand_pos = np.where(positions[cands] >= 0, positions[cands], size)
        np.add.at(onehot, (np.repeat(np.arange(count), k), cand_pos.ravel()), 1)
        used, touched = onehot[:, :size], onehot[:, :size] > 0
        free_in = np.bincount(positions[free & (positions >= 0)], minlength=size)
        total_in = np.bincount(positions[positions >= 0], minlength=size)
        left = np.where(touched, free_in - used, 0).sum(axis=1)
        total = np.where(touched, total_in, 0).sum(axis=1)
        shares.append(np.where(total > 0, 100 * left // np.maximum(total, 1), node_share))
    mean: IntArray = np.sum(shares, axis=0) // len(shares)
    return 100 - mean


def level_of(layout: NodeLayout, gpus: Sequence[int], nics: Sequence[int]) -> Level:
    """The level of a given device set (slot positions), as :func:`choose` ranks them."""
    zones = {int(layout.gpu_zone[s]) for s in gpus} | {int(layout.nic_zone[s]) for s in nics}
    groups = {int(layout.gpu_group[s]) for s in gpus} | {int(layout.nic_group[s]) for s in nics}
    if len(gpus) + len(nics) <= 1 or (len(groups) == 1 and min(groups) >= 0):
        return Level.SWITCH
    if len(zones) == 1 and min(zones) >= 0:
        return Level.NUMA
    return Level.CROSS


def _choose_without_gpus(
    layout: NodeLayout,
    free: FreeState,
    request: TopologyRequest,
    required: Level,
    nic_ok: BoolArray,
    *,
    pin_cpus: bool,
) -> Choice | None:
    """NIC-only or CPU-only pods: one NUMA node (the fullest that fits) when it matters."""
    n, cpus = request.nics, request.cpus if pin_cpus else 0
    zones = range(layout.num_zones)
    options: list[tuple[int, int, tuple[int, ...]]] = []  # (slack, zone, nics)
    for z in zones:
        nics = tuple(int(s) for s in np.flatnonzero(nic_ok & (layout.nic_zone == z))[:n])
        if len(nics) < n or free.cpus[z] < cpus:
            continue
        options.append((int(free.cpus[z]) - cpus, z, nics))
    if options:
        _, zone, nics = min(options)
        level = (
            Level.SWITCH
            if n <= 1 or len(set(layout.nic_group[list(nics)].tolist())) == 1
            else Level.NUMA
        )
        if level <= required:
            return Choice((), nics, zone, level, 0, 0)
    if required < Level.CROSS or cpus > 0:
        return None
    any_nics = tuple(int(s) for s in np.flatnonzero(nic_ok)[:n])
    if len(any_nics) < n:
        return None
    return Choice((), any_nics, None, Level.CROSS, 0, 0)

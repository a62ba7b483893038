"""Opportunistic batching: the next identical pod reuses the last cycle's work.

Why: kube-scheduler batches consecutive pods of one signature since 1.35 (KEP-5598,
OpportunisticBatching, on by default), so a Deployment of identical pods costs it one full
filter-and-score pass and then a cheap re-check of the node the previous pod took. Lattice's
vectorised cycle is cheap per node but not per plugin: a plain pod's cycle is some thirty
plugin calls, most of them deciding again what the previous identical pod already decided.

What is reused, and why the result is the same as a full cycle's (a property test compares
them): between two consecutive cycles of pods that compare equal apart from their identity,
when the only change to the snapshot is the previous pod assumed on row ``r``:

* a filter in :data:`STABLE_FILTERS` reads only the node and the pod (labels, taints,
  name, declared features; InterPodAffinity's existing pods' terms, which a pod without
  terms does not add to), so its verdicts are unchanged on every row;
* NodeResourcesFit (:data:`RERUN_FILTERS`) reads row ``r``'s requests, so it runs again:
  if it now rejects ``r``, the full cycle runs (the normalised scores below could move);
* the scores in :data:`RERUN_SCORES` are absolute per node (no normalisation over nodes)
  and run again; those in :data:`STABLE_SCORES` read only inputs the assumed pod does not
  change, and normalise over the feasible rows, which are unchanged while ``r`` stays
  feasible; those in :data:`INACTIVE_SCORES` must have stayed out (None) and stay out for
  such a pod (no claims, volumes, spread constraints, GPUs, fresh load reports);
* totals are the full cycle's sum, updated by the re-run scores' difference, and the winner
  is picked by the same rule (highest total, ties broken by ``random.Random(seed)``).

Anything else (another plugin active, a nominated pod, another change to the snapshot, a
pod with affinity terms, host ports or topology needs) runs the full cycle. Like kube's,
the reuse is opportunistic: the controller keeps one :class:`Batch` and tells it when the
chosen node was assumed; every other state change invalidates it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Final

import numpy as np

from scheduler.core.explain import FilterRecord, ScoreRecord
from scheduler.core.snapshot import BoolArray, IntArray, Snapshot
from scheduler.model.pod import Pod

Signature = tuple[object, ...]

STABLE_FILTERS: Final = frozenset(
    {
        "Unsupported",
        "NodeUnschedulable",
        "NodeName",
        "TaintToleration",
        "NodeAffinity",
        "NodeDeclaredFeatures",
        "InterPodAffinity",
    }
)
RERUN_FILTERS: Final = frozenset({"NodeResourcesFit"})
STABLE_SCORES: Final = frozenset({"TaintToleration", "NodeAffinity", "InterPodAffinity"})
RERUN_SCORES: Final = frozenset({"NodeResourcesFit", "NodeResourcesBalancedAllocation"})
INACTIVE_SCORES: Final = frozenset(
    {
        "VolumeBinding",
        "PodTopologySpread",
        "DynamicResources",
        "Topology",
        "LoadAware",
        "GPUPlacement",
    }
)


def signature(pod: Pod) -> Signature | None:
    """The pod without its identity, when its kind of pod can be batched at all (None: it
    cannot). Pods that compare equal here are scheduled alike by every plugin."""
    if (
        pod.has_pod_affinity
        or pod.required_affinity
        or pod.required_anti_affinity
        or pod.preferred_affinity
        or pod.preferred_anti_affinity
        or pod.host_ports
        or pod.spread_constraints
        or pod.storage_volumes
        or pod.resource_claims
        or pod.container_requests
        or pod.scheduling_gates
        or pod.nominated_node_name
        or pod.exclusive_cpus
    ):
        return None
    return tuple([getattr(pod, name) for name in _SIGNATURE_FIELDS])


_SIGNATURE_FIELDS: Final = tuple(
    f.name for f in dataclasses.fields(Pod) if f.name not in {"name", "uid", "node_name", "phase"}
)
"""Every field of a pod but its identity (a tuple of them compares in a few
microseconds; ``dataclasses.replace`` took ten times as long)."""


@dataclass(slots=True)
class Memo:
    """What the last full (or batched) cycle of a signature left for the next one."""

    signature: Signature
    seed: int
    node_names: tuple[str, ...]
    rejected_by: np.ndarray
    filters: tuple[FilterRecord, ...]
    candidates: BoolArray
    scores: tuple[ScoreRecord, ...]
    totals: IntArray
    skipped_filters: tuple[str, ...]
    skipped_scores: tuple[str, ...]
    row: int
    generation: int | None = None
    """The snapshot's generation right after the chosen pod was assumed (None: not yet)."""


class Batch:
    """The controller's batching state: at most one memo, the last cycle's."""

    __slots__ = ("hits", "memo", "misses")

    def __init__(self) -> None:
        self.memo: Memo | None = None
        self.hits = 0
        """Cycles served from the memo (the metric and the tests read it)."""
        self.misses = 0
        """Batchable pods that found no usable memo and ran the full cycle."""

    def clear(self) -> None:
        """A change the snapshot's generation does not show (claims, volumes, topology
        reports, settings): the next pod runs the full cycle."""
        self.memo = None

    def assumed(self, snapshot: Snapshot, node: str) -> None:
        """The pod just decided was assumed on ``node``: the memo stays usable while the
        snapshot is exactly as that left it."""
        memo = self.memo
        if memo is None:
            return
        if memo.generation is not None or memo.node_names[memo.row] != node:
            self.memo = None
            return
        memo.generation = snapshot.generation

    def usable(self, snapshot: Snapshot, sig: Signature | None, seed: int) -> Memo | None:
        memo = self.memo
        if sig is None:
            return None
        if (
            memo is None
            or memo.generation != snapshot.generation
            or memo.seed != seed
            or memo.signature != sig
        ):
            self.memo = None
            self.misses += 1
            return None
        return memo

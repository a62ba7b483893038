"""VolumeZone: a bound volume's zone and region labels must match the node's (kube 1.34).

PreFilter collects, for each claim of the pod with a volume name, the PV's values of the
four topology labels (``failure-domain.beta.kubernetes.io/zone|region`` and
``topology.kubernetes.io/zone|region``; ``a__b`` lists two zones). Unbound claims of a
WaitForFirstConsumer class are skipped (VolumeBinding decides those); any other unbound
claim, a missing claim, class or PV rejects the pod with kube's message. No labels: Skip.

Filter: a node with none of the four labels passes (single-zone clusters often label
nothing); otherwise every collected label must be present on the node with a listed value,
a beta key falling back to its GA key on the node. Failures are UnschedulableAndUnresolvable
"node(s) had no available volume zone".
"""

from __future__ import annotations

from dataclasses import dataclass
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
from scheduler.core.profile import VOLUME_ZONE, Profile
from scheduler.core.snapshot import BoolArray
from scheduler.core.volumes import VolumeState, not_found, pod_claims
from scheduler.model.pod import Pod
from scheduler.model.selectors import Operator, Requirement
from scheduler.model.volume import GA_LABEL, ZONE_LABELS, zone_values

NAME: Final = VOLUME_ZONE
REASON: Final = "node(s) had no available volume zone"
_STATE: Final = NAME


@dataclass(frozen=True, slots=True)
class _Topology:
    pv: str
    key: str
    values: tuple[str, ...]


def _topologies(pod: Pod, volumes: VolumeState) -> list[_Topology] | str:
    out: list[_Topology] = []
    for claim, _ in pod_claims(pod):
        if not claim:
            return "PersistentVolumeClaim had no name"
        pvc = volumes.pvcs.get((pod.namespace, claim))
        if pvc is None:
            return not_found("persistentvolumeclaim", claim)
        if not pvc.volume_name:
            if not pvc.storage_class:
                return "PersistentVolumeClaim had no pv name and storageClass name"
            storage_class = volumes.classes.get(pvc.storage_class)
            if storage_class is None:
                return not_found("storageclass.storage.k8s.io", pvc.storage_class)
            if storage_class.binding_mode is None:
                return f'VolumeBindingMode not set for StorageClass "{pvc.storage_class}"'
            if storage_class.delays_binding:
                continue
            return "PersistentVolume had no name"
        pv = volumes.pvs.get(pvc.volume_name)
        if pv is None:
            return not_found("persistentvolume", pvc.volume_name)
        for key in ZONE_LABELS:
            if key in pv.labels and (zones := zone_values(pv.labels[key])) is not None:
                out.append(_Topology(pv.name, key, tuple(sorted(zones))))
    return out


class VolumeZone:
    name: Final = NAME

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        volumes = cycle.volumes
        if volumes is None or not pod_claims(cycle.pod):
            return PREFILTER_SKIP
        topologies = _topologies(cycle.pod, volumes)
        if isinstance(topologies, str):
            return PreFilterResult(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, topologies)
        if not topologies:
            return PREFILTER_SKIP
        cycle.state[_STATE] = topologies
        return PREFILTER_SUCCESS

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        topologies: list[_Topology] | None = cycle.state.get(_STATE)
        if not topologies:
            return None
        snap = cycle.snapshot
        constrained = np.zeros(snap.num_nodes, dtype=np.bool_)
        for key in ZONE_LABELS:
            constrained |= snap.has_label_mask(key)
        ok = np.ones(snap.num_nodes, dtype=np.bool_)
        for t in topologies:
            has = snap.has_label_mask(t.key)
            fits = snap.requirement_mask(Requirement(t.key, Operator.IN, t.values))
            ga = GA_LABEL.get(t.key)
            if ga is not None:
                fits = fits | (~has & snap.requirement_mask(Requirement(ga, Operator.IN, t.values)))
            ok &= fits
        return FilterResult.from_mask(
            constrained & ~ok, REASON, Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        )


def new(profile: Profile) -> VolumeZone:
    return VolumeZone()

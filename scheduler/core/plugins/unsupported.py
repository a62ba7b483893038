"""Unsupported: refuse pods whose placement needs logic Lattice does not have yet.

kube-scheduler decides a PVC-backed pod's node together with the volume (VolumeBinding,
VolumeZone, VolumeRestrictions, NodeVolumeLimits) and a DRA pod's node together with its
claims' devices (DynamicResources). Lattice has the volume plugins for claims (PVCs and
generic ephemeral volumes) and for inline disks (VolumeRestrictions' conflicts of GCE PD,
AWS EBS, iSCSI and RBD disks; NodeVolumeLimits' count of migrated in-tree disks). Claims
need a VolumeState in the cycle (``lattice run`` and ``lattice explain`` pass theirs) and
VolumeBinding in the profile; inline disks need the VolumeState too (attach limits are read
from CSINodes). The gang solver passes the VolumeState too, but its joint placement judges
each member's volumes alone, so the gang flow admits only bound claims there
(:func:`~scheduler.core.volumes.gang_volume_refusal`). DRA resource claims need the
cycle's DraState and DynamicResources in the profile (``lattice run``, ``lattice explain``
and the gang flow pass theirs), and a claim whose requests use a field of a DRA feature
the mirrored release keeps off (DRAConsumableCapacity's ``capacity`` and
``distinctAttribute`` on 1.35; beta, on and allocated from 1.36) is refused naming the field;
DRADeviceTaints' ``tolerations`` are allocated as kube does. (A pod asking for an extended
resource a DeviceClass serves is DynamicResources' from 1.36, and a plain extended resource
in 1.35, where DRAExtendedResource is off.)
Binding such a pod would put it on a node its volume or devices cannot reach, where it
sits in ContainerCreating forever, so this PreFilter rejects it as
UnschedulableAndUnresolvable, with a message naming every volume and claim at fault, so
the scheduler reports FailedScheduling and ``PodScheduled=False`` and never binds it. The
volume and claim lists are immutable, so no cluster event can make the pod schedulable (a
claim's spec is immutable too).

Plain pods (no such volume, no resource claim) are skipped at PreFilter: the plugin costs a
tuple check per pod and its Filter never runs.
"""

from __future__ import annotations

from typing import Final

from scheduler.core.dra.objects import claim_alpha_fields
from scheduler.core.dra.state import DraState
from scheduler.core.framework import PREFILTER_SKIP, Code, Cycle, FilterResult, PreFilterResult
from scheduler.core.profile import DYNAMIC_RESOURCES, UNSUPPORTED, VOLUME_BINDING, Profile
from scheduler.core.snapshot import BoolArray
from scheduler.model.pod import (
    EPHEMERAL,
    PERSISTENT_VOLUME_CLAIM,
    Pod,
    ResourceClaimRef,
    StorageVolume,
)
from scheduler.model.release import DEFAULT_KUBE_MINOR

NAME: Final = UNSUPPORTED
ADVICE: Final = "use the default scheduler for this pod"
NO_VOLUME_BINDING: Final = (
    "Lattice binds claims only with VolumeBinding in the profile and the cluster's storage"
)
NO_VOLUME_STATE: Final = (
    "Lattice checks inline disks' conflicts and attach limits only with the cluster's storage"
)
NO_DRA: Final = (
    "Lattice allocates DRA resource claims only with DynamicResources in the profile and the "
    "cluster's DRA objects"
)
DRA_ALPHA: Final = (
    "DRA features off in this Kubernetes release (consumable capacity: alpha and off in "
    "kube-scheduler 1.35)"
)


def _volume(volume: StorageVolume) -> str:
    if volume.source == PERSISTENT_VOLUME_CLAIM:
        return f'PersistentVolumeClaim volume "{volume.volume}" (claim "{volume.claim}")'
    if volume.source == EPHEMERAL:
        return f'generic ephemeral volume "{volume.volume}" (claim "{volume.claim}")'
    return f'{volume.source} volume "{volume.volume}"'


def _claim(claim: ResourceClaimRef) -> str:
    if claim.claim_name:
        return f'resource claim "{claim.name}" (ResourceClaim "{claim.claim_name}")'
    if claim.template_name:
        return f'resource claim "{claim.name}" (ResourceClaimTemplate "{claim.template_name}")'
    return f'resource claim "{claim.name}"'


def _alpha_claims(pod: Pod, dra: DraState, kube_minor: int) -> list[str]:
    """The pod's claims (known to ``dra``) that use fields of features off in the
    release, each with the fields."""
    out: list[str] = []
    for ref in pod.resource_claims:
        name = pod.claim_name(ref)
        claim = dra.claims.get((pod.namespace, name)) if name else None
        fields = claim_alpha_fields(claim, kube_minor) if claim is not None else []
        if fields:
            out.append(f"{_claim(ref)} using {', '.join(fields)}")
    return out


def unsupported_reason(
    pod: Pod,
    *,
    binds_volumes: bool = False,
    checks_disks: bool = False,
    dra: DraState | None = None,
    kube_minor: int = DEFAULT_KUBE_MINOR,
) -> str | None:
    """Why Lattice cannot place ``pod`` correctly, or None when it can.

    ``binds_volumes``: the cycle has a VolumeState and the profile runs VolumeBinding, so
    claims are placed like kube-scheduler places them. ``checks_disks``: the cycle has a
    VolumeState, so inline disks' conflicts and attach limits are checked as kube does.
    ``dra``: the cycle's DraState when the profile runs DynamicResources (claims are then
    allocated as kube does, except those using fields of features ``kube_minor`` keeps off).
    """
    claimed = {PERSISTENT_VOLUME_CLAIM, EPHEMERAL}
    bound = (
        [] if binds_volumes else [_volume(v) for v in pod.storage_volumes if v.source in claimed]
    )
    inline = (
        [] if checks_disks else [_volume(v) for v in pod.storage_volumes if v.source not in claimed]
    )
    claims = [] if dra is not None else [_claim(c) for c in pod.resource_claims]
    alpha = [] if dra is None else _alpha_claims(pod, dra, kube_minor)
    clauses = [
        f"pod has {', '.join(items)}: {why}"
        for items, why in (
            (bound, NO_VOLUME_BINDING),
            (inline, NO_VOLUME_STATE),
            (claims, NO_DRA),
            (alpha, DRA_ALPHA),
        )
        if items
    ]
    if not clauses:
        return None
    return "; ".join([*clauses, ADVICE])


class Unsupported:
    name: Final = NAME

    def __init__(
        self,
        *,
        volume_binding: bool = True,
        dynamic_resources: bool = True,
        kube_minor: int = DEFAULT_KUBE_MINOR,
    ) -> None:
        self.volume_binding = volume_binding
        self.dynamic_resources = dynamic_resources
        self.kube_minor = kube_minor

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        has_state = cycle.volumes is not None
        binds = self.volume_binding and has_state
        dra = cycle.dra if self.dynamic_resources else None
        reason = unsupported_reason(
            cycle.pod,
            binds_volumes=binds,
            checks_disks=has_state,
            dra=dra,
            kube_minor=self.kube_minor,
        )
        if reason is None:
            return PREFILTER_SKIP
        return PreFilterResult(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, reason)

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        """Never reached with a verdict: PreFilter either skips the pod or rejects it."""
        return None


def new(profile: Profile) -> Unsupported:
    return Unsupported(
        volume_binding=VOLUME_BINDING in profile.filters,
        dynamic_resources=DYNAMIC_RESOURCES in profile.filters,
        kube_minor=profile.kube_minor,
    )

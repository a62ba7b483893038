"""Storage objects from the watch, and VolumeBinding's PreBind wait, for `lattice run`.

The volume plugins read a :class:`~scheduler.core.volumes.VolumeState`; this keeps it
current from seven streams (PersistentVolumes, PersistentVolumeClaims, StorageClasses,
CSINodes, VolumeAttachments, CSIDrivers, CSIStorageCapacities). An object that does not
parse is logged, dropped from the state (as if it did not exist: a claim that cannot be
read cannot be bound) and listed in :attr:`Storage.broken`; it never stops the stream.

After a decision with a :class:`~scheduler.core.volumes.VolumePlan`, VolumeBinding's step of
the binding cycle (:class:`VolumeBinding`, run by :mod:`~scheduler.control.binding_cycle`)
writes the plan's patches and then waits here, as kube's PreBind does (``checkBindings``), until
every claim of the plan is fully bound by the PV controller (or, for a provisioned claim,
by its provisioner and then the PV controller). The wait ends early with a reason when it
cannot succeed: the claim was deleted, its PV was bound to another claim, or a
provisioner removed the selected-node annotation (kube's "reschedule" signal). The step's
undo (kube's Unreserve) gives back the PVs and claims assumed for the plan unless its PreBind
saw them bound.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Mapping
from typing import Any, Final

from scheduler.control.binding_cycle import POD_GONE, Cycle, PreBindWaits
from scheduler.control.kubeio import KubeWriter
from scheduler.control.transient import failure_of
from scheduler.core.volumes import VolumePlan, VolumeState
from scheduler.model.errors import InvalidObjectError
from scheduler.model.volume import (
    SELECTED_NODE,
    CSIDriver,
    CSINode,
    CSIStorageCapacity,
    PersistentVolume,
    PersistentVolumeClaim,
    StorageClass,
    VolumeAttachment,
)

Body = Mapping[str, Any]

BIND_TIMEOUT: Final = 600.0
"""kube-scheduler's VolumeBinding ``bindTimeoutSeconds`` default."""


class Kind(enum.StrEnum):
    PV = "persistentvolume"
    PVC = "persistentvolumeclaim"
    CLASS = "storageclass"
    CSI_NODE = "csinode"
    ATTACHMENT = "volumeattachment"
    CSI_DRIVER = "csidriver"
    CAPACITY = "csistoragecapacity"


def _meta(body: Body) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def object_key(kind: Kind, body: Body) -> str:
    """``namespace/name`` for claims and capacities, ``name`` for the cluster-scoped kinds."""
    namespace, name = _meta(body)
    if kind in _NAMESPACED:
        return f"{namespace or 'default'}/{name}"
    return name


_NAMESPACED: Final = frozenset({Kind.PVC, Kind.CAPACITY})


class Storage:
    """The VolumeState's writer on the watch side, and the PreBind waits on it."""

    def __init__(self, volumes: VolumeState, *, log: Any) -> None:
        self.volumes = volumes
        self.log = log
        self.broken: dict[str, str] = {}
        """``kind/key`` -> why its body was not read."""
        self._changed = asyncio.Event()
        """Set on every change; the waits re-check their claims then."""
        self.bind_timeout_s = BIND_TIMEOUT
        """How long a PreBind waits for the PV controller (a test shortens it)."""

    # -- watch side ---------------------------------------------------------------------
    def upsert(self, kind: Kind, body: Body) -> None:
        key = object_key(kind, body)
        try:
            self._set(kind, body)
        except (InvalidObjectError, ValueError, TypeError) as exc:
            self.log.warning("storage_object_unreadable", pod=f"{kind}/{key}", reason=str(exc))
            self.broken[f"{kind}/{key}"] = str(exc)
            self._remove(kind, key)
        else:
            self.broken.pop(f"{kind}/{key}", None)
        self._notify()

    def delete(self, kind: Kind, body: Body) -> None:
        key = object_key(kind, body)
        self.broken.pop(f"{kind}/{key}", None)
        self._remove(kind, key)
        self._notify()

    def keys(self, kind: Kind) -> set[str]:
        """What is known of ``kind`` (a re-list drops the rest)."""
        v = self.volumes
        known: dict[Kind, Callable[[], set[str]]] = {
            Kind.PV: lambda: set(v.pvs),
            Kind.PVC: lambda: {f"{ns}/{name}" for ns, name in v.pvcs},
            Kind.CLASS: lambda: set(v.classes),
            Kind.CSI_NODE: lambda: set(v.csi_nodes),
            Kind.ATTACHMENT: lambda: set(v.attachments),
            Kind.CSI_DRIVER: lambda: set(v.csi_drivers),
            Kind.CAPACITY: lambda: {f"{ns}/{name}" for ns, name in v.capacities},
        }
        broken = {k.split("/", 1)[1] for k in self.broken if k.startswith(f"{kind}/")}
        return known[kind]() | broken

    def _set(self, kind: Kind, body: Body) -> None:
        v = self.volumes
        if kind is Kind.PV:
            v.set_pv(PersistentVolume.from_api(body))
        elif kind is Kind.PVC:
            v.set_pvc(PersistentVolumeClaim.from_api(body))
        elif kind is Kind.CLASS:
            v.set_class(StorageClass.from_api(body))
        elif kind is Kind.CSI_NODE:
            v.set_csi_node(CSINode.from_api(body))
        elif kind is Kind.CSI_DRIVER:
            v.set_csi_driver(CSIDriver.from_api(body))
        elif kind is Kind.CAPACITY:
            v.set_capacity(CSIStorageCapacity.from_api(body))
        else:
            v.set_attachment(VolumeAttachment.from_api(body))

    def _remove(self, kind: Kind, key: str) -> None:
        v = self.volumes
        if kind is Kind.PVC:
            namespace, name = key.split("/", 1)
            v.remove_pvc(namespace, name)
        elif kind is Kind.CAPACITY:
            namespace, name = key.split("/", 1)
            v.remove_capacity(namespace, name)
        elif kind is Kind.PV:
            v.remove_pv(key)
        elif kind is Kind.CLASS:
            v.remove_class(key)
        elif kind is Kind.CSI_NODE:
            v.remove_csi_node(key)
        elif kind is Kind.CSI_DRIVER:
            v.remove_csi_driver(key)
        else:
            v.remove_attachment(key)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- PreBind ------------------------------------------------------------------------
    def check(self, plan: VolumePlan) -> tuple[bool, str | None]:
        """``checkBindings``: (all bound, why it can never be) for the plan's claims."""
        provisioned = {(p.claim_namespace, p.claim_name) for p in plan.provisions}
        static = {(s.claim_namespace, s.claim_name): s for s in plan.static}
        done = True
        for key in plan.claims:
            pvc = self.volumes.pvcs.get(key)
            label = f"{key[0]}/{key[1]}"
            if pvc is None:
                return False, f"PVC {label} was deleted before it was bound"
            if pvc.fully_bound:
                pv = self.volumes.pvs.get(pvc.volume_name)
                if pv is None or not pv.bound_to(pvc):
                    done = False  # the PV's echo is still on its way
                continue
            done = False
            if key in static:
                pv = self.volumes.pvs.get(static[key].pv)
                if pv is None:
                    return False, f"PV {static[key].pv} for PVC {label} was deleted"
                if pv.claim_ref is not None and not pv.bound_to(pvc):
                    ref = pv.claim_ref
                    return False, (
                        f"PV {pv.name} was bound to {ref.namespace}/{ref.name}, not to PVC {label}"
                    )
            elif key in provisioned and pvc.annotations.get(SELECTED_NODE) != plan.node:
                return False, f"selectedNode annotation reset for PVC {label}"
        return done, None

    async def wait_bound(
        self,
        plan: VolumePlan,
        within: float | None = None,
        *,
        alive: Callable[[], bool] = lambda: True,
    ) -> str | None:
        """Wait until :meth:`check` says bound (None), or say why not (a reason), at most
        ``within`` seconds (None: :attr:`bind_timeout_s`). ``alive`` is asked at least once
        a second: a pod deleted meanwhile ends the wait at once rather than holding its
        node's room for the whole timeout."""
        within = self.bind_timeout_s if within is None else within
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            if not alive():
                return POD_GONE
            done, why = self.check(plan)
            if done:
                return None
            if why is not None:
                return why
            left = deadline - loop.time()
            if left <= 0:
                return f"binding volumes: timed out waiting for the condition after {within:g} s"
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), timeout=min(left, 1.0))
            except TimeoutError:
                continue


class VolumeBinding:
    """VolumeBinding's PreBind and Unreserve for one pod's plan (a binding-cycle
    :class:`~scheduler.control.binding_cycle.Step`)."""

    plugin = "VolumeBinding"
    failed_event = "volume_binding_failed"
    gone_reason = "deleted while its volumes bound"

    def __init__(
        self, storage: Storage, writer: KubeWriter | None, plan: VolumePlan, waits: PreBindWaits
    ) -> None:
        self._storage = storage
        self._writer = writer
        self.plan = plan
        self._waits = waits
        self.bound = False
        """The PreBind saw every claim bound: nothing assumed is left to give back."""

    async def run(self, cycle: Cycle) -> str | None:
        """kube's VolumeBinding PreBind: PV claimRefs, then the claims' selected-node, each
        conditional on the version the decision read; then wait until the PV controller
        (and a provisioner) bound every claim. None when done, else why not."""
        plan = self.plan
        assert self._writer is not None
        for patch in plan.patches():
            failed = await failure_of(
                self._writer.patch_volume(patch), f"updating {patch.kind} {patch.name}"
            )
            if failed is not None:
                return failed
        cycle.log.info("volumes_written", node=plan.node, reason=f"{len(plan.claims)} claim(s)")
        with self._waits.waiting(cycle.pod.uid) as alive:
            why = await self._storage.wait_bound(plan, alive=alive)
        self.bound = why is None
        return why

    async def undo(self, cycle: Cycle) -> None:
        """kube's Unreserve: the PVs and claims assumed at Reserve are given back (not once
        they were seen bound: the watch's versions stand)."""
        if not self.bound:
            self._storage.volumes.forget(self.plan)

"""Storage object bodies for the volume tests, and a cycle that sees a VolumeState.

The bodies are API-shaped dicts, exactly what the differential test sends to the API
server, so the unit tests and the differential test build objects the same way.

:func:`schedule_with_volumes` runs the whole framework with a VolumeState and checks the
decision's plan against :func:`plan_volume_bindings` (the same writes, found for the chosen
node alone), so every volume case tests both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.core.explain import Decision
from scheduler.core.plugins.volume_binding import plan_volume_bindings
from scheduler.core.profile import DEFAULT_PROFILE, Profile
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.core.volumes import VolumePlan, VolumeState
from scheduler.model.pod import Pod
from scheduler.model.volume import BIND_COMPLETED, MIGRATED_PLUGINS

Body = dict[str, Any]
HOSTNAME = "kubernetes.io/hostname"


def pv(
    name: str,
    capacity: str = "10Gi",
    *,
    storage_class: str = "local",
    host: str | None = None,
    affinity: Sequence[Sequence[Body]] | None = None,
    modes: Sequence[str] = ("ReadWriteOnce",),
    labels: Mapping[str, str] | None = None,
    claim: tuple[str, str] | None = None,
    phase: str | None = "Available",
    csi: tuple[str, str] | None = None,
    volume_mode: str | None = None,
) -> Body:
    """A PV; ``host`` pins it to one node (a local PV), ``affinity`` gives terms of
    expressions, ``csi`` is (driver, handle) (else a ``local`` source)."""
    spec: Body = {
        "capacity": {"storage": capacity},
        "accessModes": list(modes),
        "storageClassName": storage_class,
        "persistentVolumeReclaimPolicy": "Retain",
    }
    if csi is not None:
        spec["csi"] = {"driver": csi[0], "volumeHandle": csi[1]}
    else:
        spec["local"] = {"path": "/mnt/disks/" + name}
    if host is not None:
        affinity = [[{"key": HOSTNAME, "operator": "In", "values": [host]}]]
    if affinity is None and csi is None:
        affinity = [[{"key": HOSTNAME, "operator": "Exists"}]]
    if affinity is not None:
        spec["nodeAffinity"] = {
            "required": {"nodeSelectorTerms": [{"matchExpressions": list(t)} for t in affinity]}
        }
    if claim is not None:
        spec["claimRef"] = {"namespace": claim[0], "name": claim[1]}
    if volume_mode is not None:
        spec["volumeMode"] = volume_mode
    body: Body = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}}
    if labels:
        body["metadata"]["labels"] = dict(labels)
    body["spec"] = spec
    if phase is not None:
        body["status"] = {"phase": phase}
    return body


def pvc(
    name: str,
    request: str = "5Gi",
    *,
    namespace: str = "default",
    storage_class: str | None = "local",
    modes: Sequence[str] = ("ReadWriteOnce",),
    volume_name: str | None = None,
    bound: bool = False,
    selector: Body | None = None,
    selected_node: str | None = None,
    volume_mode: str | None = None,
) -> Body:
    """A claim; ``bound`` adds the PV controller's bind-completed mark (with ``volume_name``)."""
    spec: Body = {"accessModes": list(modes), "resources": {"requests": {"storage": request}}}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    if volume_name is not None:
        spec["volumeName"] = volume_name
    if selector is not None:
        spec["selector"] = selector
    if volume_mode is not None:
        spec["volumeMode"] = volume_mode
    meta: Body = {"name": name, "namespace": namespace}
    annotations: dict[str, str] = {}
    if bound:
        annotations[BIND_COMPLETED] = "yes"
    if selected_node is not None:
        annotations["volume.kubernetes.io/selected-node"] = selected_node
    if annotations:
        meta["annotations"] = annotations
    body: Body = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta}
    body["spec"] = spec
    if bound:
        body["status"] = {"phase": "Bound"}
    return body


def storage_class(
    name: str,
    *,
    provisioner: str = "kubernetes.io/no-provisioner",
    mode: str = "WaitForFirstConsumer",
    zones: Sequence[str] | None = None,
    zone_key: str = "topology.kubernetes.io/zone",
) -> Body:
    body: Body = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": provisioner,
        "volumeBindingMode": mode,
        "reclaimPolicy": "Retain",
    }
    if zones is not None:
        body["allowedTopologies"] = [
            {"matchLabelExpressions": [{"key": zone_key, "values": list(zones)}]}
        ]
    return body


def csi_node(node: str, limits: Mapping[str, int | None], migrated: Sequence[str] = ()) -> Body:
    """A CSINode with these drivers' counts (None: no ``allocatable``); ``migrated`` lists
    in-tree plugins in the ``storage.alpha.kubernetes.io/migrated-plugins`` annotation."""
    drivers: list[Body] = []
    for driver, count in limits.items():
        entry: Body = {"name": driver, "nodeID": node, "topologyKeys": None}
        if count is not None:
            entry["allocatable"] = {"count": count}
        drivers.append(entry)
    metadata: Body = {"name": node}
    if migrated:
        metadata["annotations"] = {MIGRATED_PLUGINS: ",".join(migrated)}
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSINode",
        "metadata": metadata,
        "spec": {"drivers": drivers},
    }


def csi_driver(
    name: str, *, storage_capacity: bool | None = None, required: bool | None = None
) -> Body:
    """A CSIDriver; ``required`` is ``preventPodSchedulingIfMissing`` (None: unset)."""
    spec: Body = {"attachRequired": True}
    if storage_capacity is not None:
        spec["storageCapacity"] = storage_capacity
    if required is not None:
        spec["preventPodSchedulingIfMissing"] = required
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": {"name": name},
        "spec": spec,
    }


def storage_capacity(
    name: str,
    storage_class: str,
    capacity: str | None,
    *,
    nodes: Mapping[str, str] | None = None,
    maximum: str | None = None,
    namespace: str = "kube-system",
) -> Body:
    """A CSIStorageCapacity for the nodes carrying all of ``nodes`` (None: no
    ``nodeTopology``, so no node); ``maximum`` is ``maximumVolumeSize``."""
    body: Body = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIStorageCapacity",
        "metadata": {"name": name, "namespace": namespace},
        "storageClassName": storage_class,
    }
    if nodes is not None:
        body["nodeTopology"] = {"matchLabels": dict(nodes)}
    if capacity is not None:
        body["capacity"] = capacity
    if maximum is not None:
        body["maximumVolumeSize"] = maximum
    return body


def claim_volume(volume: str, claim: str) -> Body:
    return {"name": volume, "persistentVolumeClaim": {"claimName": claim}}


def schedule_with_volumes(
    snapshot: Snapshot,
    pod: Pod,
    volumes: VolumeState,
    *,
    profile: Profile = DEFAULT_PROFILE,
    seed: int = 0,
) -> tuple[Decision, VolumePlan | None]:
    """The decision and, when a node was chosen, the volume writes to make before binding."""
    decision = Framework(profile).schedule(snapshot, pod, seed=seed, volumes=volumes)
    plan = None
    if decision.selected is not None:
        plan = plan_volume_bindings(snapshot, volumes, pod, decision.selected)
    assert decision.volume_plan == plan, (decision.volume_plan, plan)
    return decision, plan

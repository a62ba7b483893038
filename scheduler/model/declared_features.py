"""Node declared features (KEP-5328): what a pod needs a node to declare, and the bits for it.

A kubelet lists the features it supports in ``node.status.declaredFeatures`` (sorted and
unique, the API server checks that). kube-scheduler's NodeDeclaredFeatures plugin infers from
the pod's spec which of them the pod needs (component-helpers ``nodedeclaredfeatures``: each
feature's ``InferForScheduling``) and keeps the pod off nodes that do not declare them all.

Only the features whose inference can be true for a pod being scheduled are here; the rest of
kube's registry (in-place resize of pod-level resources, of non-sidecar init containers, of
memory-backed volumes, websockets to the kubelet, DRA node-allocatable resources and optional
node operations) infer nothing for scheduling, so no pod ever needs them from a node. Which of
these features a release's kube-scheduler knows is the plugin's business (core); this module
only reads the spec, for every feature of every supported release.

Each feature has a fixed bit, so a node's declared features become one integer when the node
is parsed and the snapshot keeps them as one column: a pod's check is one vector operation.
Names no feature here uses (a newer kubelet's, or features irrelevant to scheduling) are kept
on the node record but get no bit, as kube's ``TryMap`` ignores unknown names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from scheduler.model._fields import object_list, string, string_list
from scheduler.model.errors import InvalidObjectError

RESTART_ALL_CONTAINERS: Final = "RestartAllContainersOnContainerExits"
"""A container's ``restartPolicyRules`` action ``RestartAllContainers``."""
USER_NAMESPACES_HOST_NETWORK: Final = "UserNamespacesHostNetworkSupport"
"""``hostNetwork: true`` together with ``hostUsers: false``."""
VOLUME_BIND_MOUNT_OPTIONS: Final = "VolumeBindMountOptions"
"""A container's ``volumeMounts[].bindMountOptions`` is not empty."""

SCHEDULING_FEATURES: Final = (
    RESTART_ALL_CONTAINERS,
    USER_NAMESPACES_HOST_NETWORK,
    VOLUME_BIND_MOUNT_OPTIONS,
)
"""Features a pod can need for scheduling; a feature's bit is its position here."""
FEATURE_BITS: Final[Mapping[str, int]] = {
    name: 1 << i for i, name in enumerate(SCHEDULING_FEATURES)
}

RESTART_ALL_CONTAINERS_ACTION: Final = "RestartAllContainers"
NOTHING_NEEDED: Final[frozenset[str]] = frozenset()
"""What nearly every pod needs: one shared set rather than one per pod record."""


def feature_bits(names: Iterable[str]) -> int:
    """The bits of the features named (names without a bit are ignored, like kube's TryMap)."""
    bits = 0
    for name in names:
        bits |= FEATURE_BITS.get(name, 0)
    return bits


def declared_features(raw: object, field: str) -> frozenset[str]:
    """``status.declaredFeatures``: a list of strings, else an InvalidObjectError."""
    return frozenset(string_list(raw, field))


def required_features(
    spec: Mapping[str, Any],
    containers: list[Mapping[str, Any]],
    init_containers: list[Mapping[str, Any]],
) -> frozenset[str]:
    """The features the pod's spec needs a node to declare (each feature's
    ``InferForScheduling`` in component-helpers v0.37.2 ``nodedeclaredfeatures/features``).

    Restart rules count on app and init containers; bind-mount options on app, init and
    ephemeral containers, as kube reads them. Fields of the wrong type raise
    InvalidObjectError, so a broken pod gets a message instead of a crash.
    """
    needed: set[str] = set()
    groups = (
        ("spec.containers", containers),
        ("spec.initContainers", init_containers),
        ("spec.ephemeralContainers", _ephemeral(spec)),
    )
    for group, items in groups:
        for i, container in enumerate(items):
            rules, mounts = container.get("restartPolicyRules"), container.get("volumeMounts")
            if rules is None and mounts is None:  # nearly every container: no paths built
                continue
            path = f"{group}[{i}]"
            if group != "spec.ephemeralContainers" and _restarts_all(rules, path):
                needed.add(RESTART_ALL_CONTAINERS)
            if _has_bind_mount_options(mounts, path):
                needed.add(VOLUME_BIND_MOUNT_OPTIONS)
    host_users = spec.get("hostUsers")
    if host_users is not None and not isinstance(host_users, bool):
        raise InvalidObjectError("spec.hostUsers", host_users, "must be a boolean")
    if spec.get("hostNetwork") is True and host_users is False:
        needed.add(USER_NAMESPACES_HOST_NETWORK)
    return frozenset(needed) if needed else NOTHING_NEEDED


def _ephemeral(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    raw = spec.get("ephemeralContainers")
    return [] if raw is None else object_list(raw, "spec.ephemeralContainers")


def _restarts_all(raw: object, path: str) -> bool:
    if raw is None:
        return False
    field = f"{path}.restartPolicyRules"
    actions = [
        string(rule.get("action"), f"{field}[{j}].action")
        for j, rule in enumerate(object_list(raw, field))
    ]
    return RESTART_ALL_CONTAINERS_ACTION in actions


def _has_bind_mount_options(raw: object, path: str) -> bool:
    if raw is None:
        return False
    field = f"{path}.volumeMounts"
    options = [
        string_list(mount.get("bindMountOptions"), f"{field}[{j}].bindMountOptions")
        for j, mount in enumerate(object_list(raw, field))
        if "bindMountOptions" in mount
    ]
    return any(options)

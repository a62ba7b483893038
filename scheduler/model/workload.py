"""Kubernetes' own PodGroup (``scheduling.k8s.io/v1beta1``, KEP-4671/5732) as a gang source.

Why. From 1.37 (``GenericWorkload`` beta, the ``v1beta1`` API switched on) job operators can
describe a gang with the upstream API instead of scheduler-plugins' CRD: the pods name their
group in ``spec.schedulingGroup.podGroupName``, the group says ``schedulingPolicy.gang.
minCount`` and, optionally, one required topology key in ``schedulingConstraints.topology``.
An operator moving to it must keep working with Lattice, so such a group is a gang like a
scheduler-plugins PodGroup, and its status gets the condition kube-scheduler writes.

How it maps onto :class:`~scheduler.model.gang.GangSpec`:

* ``gang.minCount`` -> ``min_member``; a ``basic`` policy (no all-or-nothing) -> a gang of
  one, so its pods are placed one by one, as kube places them;
* ``schedulingConstraints.topology[0].key`` -> the required level (the same as
  ``lattice.dev/topology-required``); Lattice's annotations (preferred level, slices) are
  read from the group's metadata as on a scheduler-plugins PodGroup;
* the gang's key is ``namespace/scheduling.k8s.io:name`` (:data:`UPSTREAM_PREFIX`), so a
  scheduler-plugins PodGroup of the same name in the namespace is another gang;
* no ``scheduleTimeoutSeconds`` or ``minResources`` upstream: none.

Status: ``PodGroupInitiallyScheduled`` (:func:`initially_scheduled_status`), True with
reason ``Scheduled`` once the gang is admitted and never reverted (kube's rule), else False
with ``Unschedulable`` and the solver's message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from scheduler.model._fields import mapping, object_list, string
from scheduler.model.errors import InvalidObjectError
from scheduler.model.gang import TOPOLOGY_REQUIRED_ANNOTATION, GangSpec
from scheduler.model.podgroup import format_rfc3339, gang_from_podgroup

UPSTREAM_GROUP: Final = "scheduling.k8s.io"
UPSTREAM_VERSION: Final = "v1beta1"
UPSTREAM_PLURAL: Final = "podgroups"
UPSTREAM_PREFIX: Final = "scheduling.k8s.io:"
"""Before the group's name in a gang key: ':' is in no object name, so never a collision."""
INITIALLY_SCHEDULED: Final = "PodGroupInitiallyScheduled"


def is_upstream(name: str) -> bool:
    """Whether a gang's name (the part after ``namespace/``) is an upstream PodGroup's."""
    return name.startswith(UPSTREAM_PREFIX)


def object_name(name: str) -> str:
    """The PodGroup's own name from a gang name."""
    return name.removeprefix(UPSTREAM_PREFIX)


def pod_group_name(spec: Mapping[str, Any]) -> str | None:
    """The upstream group a pod spec names (``spec.schedulingGroup.podGroupName``), or None."""
    group = spec.get("schedulingGroup")
    if not isinstance(group, Mapping):
        return None
    name = group.get("podGroupName")
    return name if isinstance(name, str) and name else None


def gang_from_upstream(body: Mapping[str, Any]) -> GangSpec:
    """The gang contract of one upstream PodGroup; :class:`InvalidObjectError` names any bad
    field (the API server validates most; what it lets through and Lattice cannot honour,
    such as a topology key that is no label key, is refused here)."""
    if not isinstance(body, Mapping):
        raise InvalidObjectError("podgroup", body, "must be an object")
    metadata = dict(mapping(body.get("metadata"), "metadata"))
    spec = mapping(body.get("spec"), "spec")
    policy = mapping(spec.get("schedulingPolicy"), "spec.schedulingPolicy")
    gang = policy.get("gang")
    min_count: object = 1
    if gang is not None:
        min_count = mapping(gang, "spec.schedulingPolicy.gang").get("minCount")
        if min_count is None:
            raise InvalidObjectError(
                "spec.schedulingPolicy.gang.minCount", None, "a gang policy needs minCount"
            )
    elif policy.get("basic") is None:
        raise InvalidObjectError(
            "spec.schedulingPolicy", dict(policy), "neither basic nor gang is set"
        )
    constraints = mapping(spec.get("schedulingConstraints"), "spec.schedulingConstraints")
    topology = object_list(constraints.get("topology"), "spec.schedulingConstraints.topology")
    annotations = dict(mapping(metadata.get("annotations"), "metadata.annotations"))
    if topology:
        if len(topology) > 1:
            raise InvalidObjectError(
                "spec.schedulingConstraints.topology",
                len(topology),
                "Lattice honours one required topology key, as kube-scheduler 1.37 does",
            )
        key = string(
            mapping(topology[0], "spec.schedulingConstraints.topology[0]").get("key"),
            "spec.schedulingConstraints.topology[0].key",
        )
        set_by_annotation = annotations.get(TOPOLOGY_REQUIRED_ANNOTATION)
        if set_by_annotation is not None and set_by_annotation != key:
            raise InvalidObjectError(
                f"metadata.annotations[{TOPOLOGY_REQUIRED_ANNOTATION}]",
                set_by_annotation,
                f"differs from spec.schedulingConstraints.topology[0].key ({key!r}); set one",
            )
        annotations[TOPOLOGY_REQUIRED_ANNOTATION] = key
    name = string(metadata.get("name"), "metadata.name")
    translated = {
        "metadata": {**metadata, "name": UPSTREAM_PREFIX + name, "annotations": annotations},
        "spec": {"minMember": min_count},
    }
    return gang_from_podgroup(translated)


def initially_scheduled_status(
    *,
    admitted: bool,
    reason: str,
    message: str,
    now: float,
    previous: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The status to write: ``PodGroupInitiallyScheduled`` True/``Scheduled`` once admitted
    (then kept whatever follows, as kube keeps it), else False with ``reason``; other
    writers' conditions kept; ``lastTransitionTime`` kept while the status holds."""
    prev = previous if isinstance(previous, Mapping) else {}
    conditions = [c for c in prev.get("conditions") or () if isinstance(c, Mapping)]
    mine = next((c for c in conditions if c.get("type") == INITIALLY_SCHEDULED), None)
    others = [dict(c) for c in conditions if c.get("type") != INITIALLY_SCHEDULED]
    if mine is not None and mine.get("status") == "True":
        return {"conditions": [*others, dict(mine)]}  # terminal
    status = "True" if admitted else "False"
    transition = format_rfc3339(now)
    if mine is not None and mine.get("status") == status and mine.get("lastTransitionTime"):
        transition = str(mine["lastTransitionTime"])
    condition = {
        "type": INITIALLY_SCHEDULED,
        "status": status,
        "reason": "Scheduled" if admitted else reason,
        "message": message[:32768],
        "lastTransitionTime": transition,
    }
    return {"conditions": [*others, condition]}

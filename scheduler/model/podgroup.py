"""scheduler-plugins' ``PodGroup`` (``scheduling.x-k8s.io/v1alpha1``) as a Lattice gang source.

Kubeflow's training operator (``--gang-scheduler-name`` other than volcano), the coscheduling
plugin's users and many job frameworks create these objects: one per job, named after it,
with the job's annotations copied, ``spec.minMember`` (the replicas, or
``schedulingPolicy.minAvailable``), ``spec.minResources`` and
``spec.scheduleTimeoutSeconds``; pods join with the ``scheduling.x-k8s.io/pod-group`` label.
This module turns such an object into the neutral :class:`~scheduler.model.gang.GangSpec`
and builds the ``status`` Lattice writes back. Pure: no I/O, no clock (``now`` is passed in).

Theory of operation
-------------------
* Parsing follows upstream's Go types and schema: ``minMember`` is an int32 of at least 1
  (upstream's CRD says ``minimum: 1``; absent decodes to 0 in Go, which coscheduling treats
  as "no quorum", the same contract as our 1); ``scheduleTimeoutSeconds`` is an optional
  int32 taken literally, 0 included, as coscheduling does; negative values, which upstream's
  schema lets through, are refused here. ``minResources`` is a ``v1.ResourceList`` rounded
  like every amount in the model (cpu in millicores, the rest in units). Every malformed
  field raises :class:`~scheduler.model.errors.InvalidObjectError` naming it, so the
  controller can report it verbatim instead of guessing.
* ``status.scheduleStartTime`` survives restarts: it is read back so the timeout does not
  restart with the scheduler. Go's ``metav1.Time`` writes its zero value as ``null``; a
  literal zero time (year 1) is read as unset too, as ``IsZero`` would.
* Status is what upstream's controller writes (phase, running/succeeded/failed,
  scheduleStartTime) plus two optional fields upstream's current schema lacks:
  ``scheduled`` (older upstream schemas had it) and ``conditions``, one condition of type
  :data:`SCHEDULED_CONDITION` whose status follows from the phase (:data:`PHASE_ADMITTED`).
  Times are RFC 3339 at second precision, like ``metav1.Time``.
* A cluster may run upstream's own CRD, whose structural schema prunes ``scheduled`` and
  ``conditions`` on write. :func:`pruned_fields` tells the caller which fields the server
  dropped, and :func:`status_changed` can then ignore them, so status is written on change
  only instead of on every cycle.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final, NotRequired, TypedDict

from scheduler.model._fields import integer, mapping, string, string_map
from scheduler.model.errors import InvalidObjectError
from scheduler.model.gang import (
    GANG_TOPOLOGY_ANNOTATION,
    TOPOLOGY_PREFERRED_ANNOTATION,
    TOPOLOGY_REQUIRED_ANNOTATION,
    TOPOLOGY_SLICE_REQUIRED_ANNOTATION,
    TOPOLOGY_SLICE_SIZE_ANNOTATION,
    GangSpec,
)
from scheduler.model.names import qualified_name_error
from scheduler.model.resources import parse_resource_list, round_resources

GROUP: Final = "scheduling.x-k8s.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "PodGroup"
PLURAL: Final = "podgroups"

SCHEDULED_CONDITION: Final = "Scheduled"
"""Our condition type (upstream defines none): True once the gang is admitted, i.e. at least
``minMember`` members are placed; False, with the reason, while it waits or after it failed."""

_INT32_MAX: Final = 2**31 - 1
_RFC3339: Final = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})")
# metav1.Condition's reason: CamelCase-ish, machine readable.
_REASON: Final = re.compile(r"[A-Za-z](?:[A-Za-z0-9_,:]*[A-Za-z0-9_])?")
_REASON_MAX: Final = 1024
_MESSAGE_MAX: Final = 32768


class PodGroupPhase(StrEnum):
    """Every phase scheduler-plugins has defined; PreScheduling and Scheduled are from its
    older API (``scheduling.sigs.k8s.io``) and still read by tools written against it."""

    PENDING = "Pending"
    """Accepted; fewer than ``minMember`` members placed."""
    PRE_SCHEDULING = "PreScheduling"
    """Older upstream: all members exist and wait to be scheduled."""
    SCHEDULING = "Scheduling"
    """Some members placed, not yet ``minMember``."""
    SCHEDULED = "Scheduled"
    """At least ``minMember`` members placed (the gang is admitted), not all running yet."""
    RUNNING = "Running"
    """At least ``minMember`` members running."""
    FINISHED = "Finished"
    """``minMember`` members succeeded."""
    FAILED = "Failed"
    """The gang timed out before admission, or members failed."""
    UNKNOWN = "Unknown"
    """Part of the gang placed, the rest cannot be; waiting for its controller."""


PHASE_ADMITTED: Final[Mapping[PodGroupPhase, bool]] = MappingProxyType(
    {
        PodGroupPhase.PENDING: False,
        PodGroupPhase.PRE_SCHEDULING: False,
        PodGroupPhase.SCHEDULING: False,
        PodGroupPhase.SCHEDULED: True,
        PodGroupPhase.RUNNING: True,
        PodGroupPhase.FINISHED: True,
        PodGroupPhase.FAILED: False,
        PodGroupPhase.UNKNOWN: False,
    }
)
"""The status of the :data:`SCHEDULED_CONDITION` in each phase, written down in one place."""


class PodGroupCondition(TypedDict):
    """One ``metav1.Condition``."""

    type: str
    status: str
    reason: str
    message: str
    lastTransitionTime: str
    observedGeneration: NotRequired[int]


class PodGroupStatus(TypedDict, total=False):
    """The ``status`` body Lattice writes, as a JSON merge patch of the status subresource.

    ``scheduleStartTime`` is ``None`` only to clear a start time the object still carries.
    """

    phase: str
    scheduled: int
    running: int
    succeeded: int
    failed: int
    scheduleStartTime: str | None
    conditions: list[PodGroupCondition]


# --- parsing -------------------------------------------------------------------------------


def gang_from_podgroup(body: Mapping[str, Any]) -> GangSpec:
    """The gang contract of one PodGroup; :class:`InvalidObjectError` names any bad field."""
    if not isinstance(body, Mapping):
        raise InvalidObjectError("podgroup", body, "must be an object")
    metadata = mapping(body.get("metadata"), "metadata")
    spec = mapping(body.get("spec"), "spec")
    status = mapping(body.get("status"), "status")

    name = string(metadata.get("name"), "metadata.name")
    if not name:
        raise InvalidObjectError("metadata.name", metadata.get("name"), "a PodGroup needs a name")
    namespace = string(metadata.get("namespace"), "metadata.namespace") or "default"
    annotations = string_map(metadata.get("annotations"), "metadata.annotations")
    generation = metadata.get("generation")
    if generation is not None and (isinstance(generation, bool) or not isinstance(generation, int)):
        raise InvalidObjectError("metadata.generation", generation, "must be an integer")

    min_member = integer(
        spec.get("minMember"), "spec.minMember", default=1, minimum=1, maximum=_INT32_MAX
    )
    min_resources = round_resources(
        parse_resource_list(spec.get("minResources"), field="spec.minResources"),
        field="spec.minResources",
    )
    timeout: int | None = None
    if spec.get("scheduleTimeoutSeconds") is not None:
        timeout = integer(
            spec["scheduleTimeoutSeconds"],
            "spec.scheduleTimeoutSeconds",
            default=0,
            minimum=0,
            maximum=_INT32_MAX,
        )

    required = {
        a: _label_key(annotations, a)
        for a in (TOPOLOGY_REQUIRED_ANNOTATION, GANG_TOPOLOGY_ANNOTATION)
        if a in annotations
    }
    if len(set(required.values())) > 1:
        raise InvalidObjectError(
            f"metadata.annotations[{TOPOLOGY_REQUIRED_ANNOTATION}]",
            required[TOPOLOGY_REQUIRED_ANNOTATION],
            f"differs from {GANG_TOPOLOGY_ANNOTATION} "
            f"({required[GANG_TOPOLOGY_ANNOTATION]!r}), its older name; set one",
        )
    topology_key = next(iter(required.values()), None)
    preferred: str | None = None
    if TOPOLOGY_PREFERRED_ANNOTATION in annotations:
        preferred = _label_key(annotations, TOPOLOGY_PREFERRED_ANNOTATION)
    slice_size, slice_key = _slices(annotations, min_member)

    return GangSpec(
        namespace=namespace,
        name=name,
        uid=string(metadata.get("uid"), "metadata.uid"),
        min_member=min_member,
        min_resources=min_resources,
        schedule_timeout_s=timeout,
        topology_key=topology_key,
        topology_preferred=preferred,
        slice_size=slice_size,
        slice_key=slice_key,
        schedule_start_time=parse_rfc3339(
            status.get("scheduleStartTime"), field="status.scheduleStartTime"
        ),
        generation=generation,
    )


def _label_key(annotations: Mapping[str, str], annotation: str) -> str:
    """The node label key an annotation names; :class:`InvalidObjectError` if it is none."""
    key = annotations[annotation]
    problem = qualified_name_error(key)
    if problem is not None:
        raise InvalidObjectError(
            f"metadata.annotations[{annotation}]", key, f"must be a node label key: {problem}"
        )
    return key


def _slices(annotations: Mapping[str, str], min_member: int) -> tuple[int | None, str | None]:
    """The slice size and level, both or neither; the size a positive integer dividing
    ``minMember`` (a quorum of whole slices)."""
    size_a, key_a = TOPOLOGY_SLICE_SIZE_ANNOTATION, TOPOLOGY_SLICE_REQUIRED_ANNOTATION
    if size_a not in annotations and key_a not in annotations:
        return None, None
    for present, absent in ((size_a, key_a), (key_a, size_a)):
        if present in annotations and absent not in annotations:
            raise InvalidObjectError(
                f"metadata.annotations[{present}]", annotations[present], f"needs {absent} too"
            )
    raw = annotations[size_a]
    if not re.fullmatch(r"[1-9][0-9]{0,9}", raw.strip()) or int(raw) > _INT32_MAX:
        raise InvalidObjectError(
            f"metadata.annotations[{size_a}]", raw, "must be a positive integer"
        )
    size = int(raw)
    if min_member % size:
        raise InvalidObjectError(
            f"metadata.annotations[{size_a}]",
            raw,
            f"must divide spec.minMember ({min_member}) so the quorum is whole slices",
        )
    return size, _label_key(annotations, key_a)


def check_levels(
    spec: GangSpec, levels: Collection[str], *, source: str = "spec.topology.levels"
) -> None:
    """:class:`InvalidObjectError` if the slice level is not one of ``spec.topology.levels``
    (the configured hierarchy, known to the controller, not to the PodGroup); ``source``
    names where the levels come from (a Kueue Topology's, with ``fromKueue``)."""
    if spec.slice_key is not None and spec.slice_key not in levels:
        configured = ", ".join(levels) if levels else "none configured"
        raise InvalidObjectError(
            f"metadata.annotations[{TOPOLOGY_SLICE_REQUIRED_ANNOTATION}]",
            spec.slice_key,
            f"must be one of {source} ({configured})",
        )


def parse_rfc3339(raw: object, *, field: str) -> float | None:
    """Unix time of an RFC 3339 ``metav1.Time``; None for null or Go's zero time."""
    if raw is None:
        return None
    if not isinstance(raw, str) or not _RFC3339.fullmatch(raw):
        raise InvalidObjectError(
            field, raw, "must be an RFC 3339 time such as 2025-03-01T12:00:00Z"
        )
    try:
        # fromisoformat keeps microseconds of a longer (RFC3339Nano) fraction.
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidObjectError(field, raw, f"not a valid time: {exc}") from exc
    if parsed.year == 1:  # Go's zero time (metav1.Time.IsZero), written by hand
        return None
    return parsed.timestamp()


def format_rfc3339(t: float) -> str:
    """Whole seconds in UTC with ``Z``, the form ``metav1.Time`` writes."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- status --------------------------------------------------------------------------------


def podgroup_status(
    *,
    phase: str,
    scheduled: int,
    running: int,
    succeeded: int,
    failed: int,
    schedule_start_time: float | None,
    reason: str,
    message: str,
    now: float,
    previous: Mapping[str, Any] | None,
    observed_generation: int | None = None,
) -> PodGroupStatus:
    """The status to write; ``previous`` (the object's current status) keeps the condition's
    ``lastTransitionTime`` while its status holds, and other writers' conditions in place.

    Bad arguments are caller bugs and raise ``ValueError``; a malformed ``previous`` is
    overwritten rather than refused, so a broken status can always be repaired.
    """
    try:
        known = PodGroupPhase(phase)
    except ValueError:
        raise ValueError(f"unknown PodGroup phase {phase!r}") from None
    counts = {"scheduled": scheduled, "running": running, "succeeded": succeeded, "failed": failed}
    for key, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _INT32_MAX:
            raise ValueError(f"{key} must be an int32 count, not {value!r}")
    if not _REASON.fullmatch(reason) or len(reason) > _REASON_MAX:
        raise ValueError(f"condition reason {reason!r} must be CamelCase like 'Unschedulable'")
    if len(message) > _MESSAGE_MAX:
        message = message[: _MESSAGE_MAX - 3] + "..."

    prev = previous if isinstance(previous, Mapping) else {}
    prev_conditions = prev.get("conditions")
    others: list[PodGroupCondition] = []
    mine: Mapping[str, Any] | None = None
    if isinstance(prev_conditions, list):
        for c in prev_conditions:
            if not isinstance(c, Mapping) or not isinstance(c.get("type"), str):
                continue
            if c["type"] == SCHEDULED_CONDITION:
                mine = c
            elif _is_condition(c):
                others.append(_copy_condition(c))

    condition_status = "True" if PHASE_ADMITTED[known] else "False"
    transition = format_rfc3339(now)
    if mine is not None and mine.get("status") == condition_status:
        kept = mine.get("lastTransitionTime")
        if isinstance(kept, str) and _RFC3339.fullmatch(kept):
            transition = kept
    condition: PodGroupCondition = {
        "type": SCHEDULED_CONDITION,
        "status": condition_status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
    }
    if observed_generation is not None:
        condition["observedGeneration"] = observed_generation

    status: PodGroupStatus = {
        "phase": known.value,
        "scheduled": scheduled,
        "running": running,
        "succeeded": succeeded,
        "failed": failed,
        "conditions": [*others, condition],
    }
    if schedule_start_time is not None:
        status["scheduleStartTime"] = format_rfc3339(schedule_start_time)
    elif prev.get("scheduleStartTime") is not None:
        status["scheduleStartTime"] = None  # merge patch: remove the stale start time
    return status


def _is_condition(c: Mapping[str, Any]) -> bool:
    return all(
        isinstance(c.get(k), str) for k in ("type", "status", "reason", "lastTransitionTime")
    ) and isinstance(c.get("message", ""), str)


def _copy_condition(c: Mapping[str, Any]) -> PodGroupCondition:
    out: PodGroupCondition = {
        "type": c["type"],
        "status": c["status"],
        "reason": c["reason"],
        "message": c.get("message", ""),
        "lastTransitionTime": c["lastTransitionTime"],
    }
    generation = c.get("observedGeneration")
    if isinstance(generation, int) and not isinstance(generation, bool):
        out["observedGeneration"] = generation
    return out


def status_changed(
    current: Mapping[str, Any] | None,
    desired: Mapping[str, Any],
    *,
    pruned: Collection[str] = (),
) -> bool:
    """Whether merging ``desired`` into ``current`` would change anything that matters.

    Only the keys ``desired`` sets count (other writers' fields, e.g. upstream's
    ``occupiedBy``, are not ours to compare), minus ``pruned`` ones the server drops.
    Condition ``lastTransitionTime`` is ignored: it moves only when a condition's status
    does, which is compared. ``scheduleStartTime`` is compared as an instant, at the second
    precision it is stored with, so ``Z`` against ``+00:00`` is no change.
    """
    cur = current if isinstance(current, Mapping) else {}
    for key, want in desired.items():
        if key in pruned:
            continue
        have = cur.get(key)
        if key == "conditions":
            if _conditions_key(have) != _conditions_key(want):
                return True
        elif key == "scheduleStartTime":
            if _instant(have) != _instant(want):
                return True
        elif have != want:
            return True
    return False


def pruned_fields(sent: Mapping[str, Any], stored: Mapping[str, Any] | None) -> frozenset[str]:
    """Top-level status fields written with a value but absent after the write: the
    installed CRD's schema (e.g. upstream's, without ``scheduled``) does not declare them."""
    kept = stored if isinstance(stored, Mapping) else {}
    return frozenset(k for k, v in sent.items() if v is not None and k not in kept)


def _instant(raw: object) -> object:
    """Whole seconds of a time string; anything unparseable compares as itself."""
    if not isinstance(raw, str):
        return raw
    try:
        t = parse_rfc3339(raw, field="status.scheduleStartTime")
    except InvalidObjectError:
        return raw
    return None if t is None else int(t // 1)


def _conditions_key(raw: object) -> list[tuple[Any, ...]] | None:
    if not isinstance(raw, list):
        return None
    out: list[tuple[Any, ...]] = []
    for c in raw:
        if not isinstance(c, Mapping):
            out.append(("?", repr(c)))
            continue
        out.append(
            tuple(c.get(k) for k in ("type", "status", "reason", "message", "observedGeneration"))
        )
    return out

"""PodGroup parsing, the status builder, change detection, and the shape of crds/podgroup.yaml.

The bodies are what Kubeflow's training operator creates for a PyTorchJob with a
``schedulingPolicy`` (name, namespace, the job's annotations, a controller reference, and
``minMember``/``minResources``/``scheduleTimeoutSeconds`` as Go serialises them).
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.model.errors import InvalidObjectError
from scheduler.model.gang import (
    GANG_TOPOLOGY_ANNOTATION,
    TOPOLOGY_PREFERRED_ANNOTATION,
    TOPOLOGY_REQUIRED_ANNOTATION,
    TOPOLOGY_SLICE_REQUIRED_ANNOTATION,
    TOPOLOGY_SLICE_SIZE_ANNOTATION,
    GangSpec,
)
from scheduler.model.podgroup import (
    API_VERSION,
    GROUP,
    KIND,
    PHASE_ADMITTED,
    PLURAL,
    SCHEDULED_CONDITION,
    VERSION,
    PodGroupPhase,
    check_levels,
    format_rfc3339,
    gang_from_podgroup,
    parse_rfc3339,
    podgroup_status,
    pruned_fields,
    status_changed,
)
from tests.agent.crd_schema import object_schema, validate

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "podgroup.yaml"
GI = 1024**3
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC).timestamp()
T0_TEXT = "2025-03-01T12:00:00Z"


def training_operator_podgroup(**spec: Any) -> dict[str, Any]:
    """What the training operator sends for PyTorchJob ``mnist`` (1 master + 3 workers)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": "mnist",
            "namespace": "team-a",
            "creationTimestamp": None,
            "annotations": {GANG_TOPOLOGY_ANNOTATION: "topology.kubernetes.io/zone"},
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": "mnist",
                    "uid": "0b6f3c2e-7d1a-4f5e-9a43-3c5d2f1e8b70",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "minMember": 4,
            "minResources": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "4"},
            "scheduleTimeoutSeconds": 120,
            **spec,
        },
        # Go's PodGroupStatus is a struct and metav1.Time marshals its zero value as null.
        "status": {"scheduleStartTime": None},
    }


def _with(path: str, value: Any) -> dict[str, Any]:
    body = training_operator_podgroup()
    target: Any = body
    *parents, last = path.split(".")
    for key in parents:
        target = target.setdefault(key, {})
    target[last] = value
    return body


# --- parsing -------------------------------------------------------------------------------


def test_training_operator_podgroup() -> None:
    body = training_operator_podgroup()
    body["metadata"] |= {"uid": "u-1", "generation": 3}
    assert gang_from_podgroup(body) == GangSpec(
        namespace="team-a",
        name="mnist",
        uid="u-1",
        min_member=4,
        min_resources={"cpu": 16_000, "memory": 64 * GI, "nvidia.com/gpu": 4},
        schedule_timeout_s=120,
        topology_key="topology.kubernetes.io/zone",
        schedule_start_time=None,
        generation=3,
    )


def test_topology_annotations_required_alias_and_preferred() -> None:
    body = _with(
        "metadata.annotations",
        {
            TOPOLOGY_REQUIRED_ANNOTATION: "example.com/block",
            GANG_TOPOLOGY_ANNOTATION: "example.com/block",  # the older name, same key
            TOPOLOGY_PREFERRED_ANNOTATION: "example.com/rack",
        },
    )
    gang = gang_from_podgroup(body)
    assert (gang.topology_key, gang.topology_preferred) == ("example.com/block", "example.com/rack")
    only_preferred = _with("metadata.annotations", {TOPOLOGY_PREFERRED_ANNOTATION: "rack"})
    gang = gang_from_podgroup(only_preferred)
    assert (gang.topology_key, gang.topology_preferred) == (None, "rack")


SLICES = {
    TOPOLOGY_SLICE_SIZE_ANNOTATION: "2",
    TOPOLOGY_SLICE_REQUIRED_ANNOTATION: "example.com/rack",
}


def test_slice_annotations() -> None:
    gang = gang_from_podgroup(_with("metadata.annotations", SLICES))  # minMember 4
    assert (gang.slice_size, gang.slice_key) == (2, "example.com/rack")
    check_levels(gang, ["example.com/block", "example.com/rack"])
    with pytest.raises(InvalidObjectError) as info:
        check_levels(gang, ["example.com/block"])
    assert info.value.field == f"metadata.annotations[{TOPOLOGY_SLICE_REQUIRED_ANNOTATION}]"
    assert "must be one of spec.topology.levels (example.com/block)" in str(info.value)
    with pytest.raises(InvalidObjectError, match="none configured"):
        check_levels(gang, [])
    plain = gang_from_podgroup(_with("metadata.annotations", {}))
    assert (plain.slice_size, plain.slice_key) == (None, None)
    check_levels(plain, [])  # no slices: nothing to check


@pytest.mark.parametrize(
    ("annotations", "field", "reason"),
    [
        pytest.param(
            {TOPOLOGY_SLICE_SIZE_ANNOTATION: "2"},
            TOPOLOGY_SLICE_SIZE_ANNOTATION,
            f"needs {TOPOLOGY_SLICE_REQUIRED_ANNOTATION} too",
            id="size-alone",
        ),
        pytest.param(
            {TOPOLOGY_SLICE_REQUIRED_ANNOTATION: "example.com/rack"},
            TOPOLOGY_SLICE_REQUIRED_ANNOTATION,
            f"needs {TOPOLOGY_SLICE_SIZE_ANNOTATION} too",
            id="level-alone",
        ),
        pytest.param(
            {**SLICES, TOPOLOGY_SLICE_SIZE_ANNOTATION: "3"},
            TOPOLOGY_SLICE_SIZE_ANNOTATION,
            "must divide spec.minMember (4)",
            id="size-not-dividing",
        ),
        pytest.param(
            {**SLICES, TOPOLOGY_SLICE_SIZE_ANNOTATION: "0"},
            TOPOLOGY_SLICE_SIZE_ANNOTATION,
            "positive integer",
            id="size-zero",
        ),
        pytest.param(
            {**SLICES, TOPOLOGY_SLICE_SIZE_ANNOTATION: "two"},
            TOPOLOGY_SLICE_SIZE_ANNOTATION,
            "positive integer",
            id="size-word",
        ),
        pytest.param(
            {**SLICES, TOPOLOGY_SLICE_REQUIRED_ANNOTATION: "a rack"},
            TOPOLOGY_SLICE_REQUIRED_ANNOTATION,
            "node label key",
            id="level-not-label-key",
        ),
    ],
)
def test_bad_slice_annotations(annotations: dict[str, str], field: str, reason: str) -> None:
    with pytest.raises(InvalidObjectError) as info:
        gang_from_podgroup(_with("metadata.annotations", annotations))
    assert info.value.field == f"metadata.annotations[{field}]"
    assert reason in str(info.value), str(info.value)


def test_minimal_podgroup_takes_upstream_defaults() -> None:
    gang = gang_from_podgroup({"metadata": {"name": "g"}})
    assert (gang.namespace, gang.key) == ("default", "default/g")
    assert gang.min_member == 1  # Go decodes a missing minMember as 0: no quorum
    assert gang.min_resources == {}
    assert gang.schedule_timeout_s is None
    assert gang.topology_key is None
    assert gang.schedule_start_time is None
    assert gang.generation is None


@pytest.mark.parametrize(
    ("min_resources", "expected"),
    [
        pytest.param({"cpu": "500m"}, {"cpu": 500}, id="millicores"),
        pytest.param({"cpu": 2, "memory": 1024}, {"cpu": 2000, "memory": 1024}, id="json-ints"),
        pytest.param({"cpu": "1.0001"}, {"cpu": 1001}, id="cpu-rounds-up"),
        pytest.param({"memory": "1.5Gi"}, {"memory": 3 * GI // 2}, id="binary-fraction"),
        pytest.param({"hugepages-2Mi": "1Gi"}, {"hugepages-2Mi": GI}, id="hugepages"),
        pytest.param({"pods": "4", "cpu": "1"}, {"cpu": 1000}, id="pods-not-accounted"),
        pytest.param({"cpu": "0"}, {"cpu": 0}, id="zero"),
    ],
)
def test_min_resources_are_integer_amounts(
    min_resources: dict[str, Any], expected: dict[str, int]
) -> None:
    gang = gang_from_podgroup(training_operator_podgroup(minResources=min_resources))
    assert gang.min_resources == expected


def test_schedule_timeout_zero_is_taken_literally() -> None:
    assert gang_from_podgroup(_with("spec.scheduleTimeoutSeconds", 0)).schedule_timeout_s == 0
    assert gang_from_podgroup(_with("spec.scheduleTimeoutSeconds", None)).schedule_timeout_s is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(T0_TEXT, T0, id="utc"),
        pytest.param("2025-03-01T13:30:00+01:30", T0, id="offset"),
        pytest.param("2025-03-01T12:00:00.250000Z", T0 + 0.25, id="micro"),
        pytest.param("2025-03-01T12:00:00.123456789Z", T0 + 0.123456, id="nano-truncated"),
        pytest.param(None, None, id="null"),
        pytest.param("0001-01-01T00:00:00Z", None, id="go-zero-time"),
    ],
)
def test_schedule_start_time(text: str | None, expected: float | None) -> None:
    gang = gang_from_podgroup(_with("status.scheduleStartTime", text))
    assert gang.schedule_start_time == (pytest.approx(expected) if expected else None)


@pytest.mark.parametrize(
    ("path", "value", "field", "reason"),
    [
        pytest.param("spec.minMember", 0, "spec.minMember", ">= 1", id="min-member-zero"),
        pytest.param("spec.minMember", -1, "spec.minMember", ">= 1", id="min-member-negative"),
        pytest.param("spec.minMember", 2.5, "spec.minMember", "integer", id="min-member-float"),
        pytest.param("spec.minMember", "4", "spec.minMember", "integer", id="min-member-string"),
        pytest.param("spec.minMember", True, "spec.minMember", "integer", id="min-member-bool"),
        pytest.param("spec.minMember", 2**31, "spec.minMember", "2147483647", id="min-member-big"),
        pytest.param(
            "spec.minResources",
            {"cpu": "lots"},
            "spec.minResources[cpu]",
            "regular expression",
            id="bad-quantity",
        ),
        pytest.param(
            "spec.minResources",
            {"memory": "-1Gi"},
            "spec.minResources[memory]",
            ">= 0",
            id="negative-quantity",
        ),
        pytest.param(
            "spec.minResources", ["cpu"], "spec.minResources", "map", id="resources-not-map"
        ),
        pytest.param(
            "spec.minResources",
            {"nvidia.com/gpu": "1E30"},
            "spec.minResources[nvidia.com/gpu]",
            "64-bit",
            id="quantity-overflows",
        ),
        pytest.param(
            "spec.scheduleTimeoutSeconds",
            -5,
            "spec.scheduleTimeoutSeconds",
            ">= 0",
            id="negative-timeout",
        ),
        pytest.param(
            "spec.scheduleTimeoutSeconds",
            "60s",
            "spec.scheduleTimeoutSeconds",
            "integer",
            id="timeout-string",
        ),
        pytest.param(
            "metadata.annotations",
            {GANG_TOPOLOGY_ANNOTATION: "not a key"},
            f"metadata.annotations[{GANG_TOPOLOGY_ANNOTATION}]",
            "node label key",
            id="topology-not-label-key",
        ),
        pytest.param(
            "metadata.annotations",
            {GANG_TOPOLOGY_ANNOTATION: "Example.com/zone"},
            f"metadata.annotations[{GANG_TOPOLOGY_ANNOTATION}]",
            "lowercase",
            id="topology-uppercase-prefix",
        ),
        pytest.param(
            "metadata.annotations",
            {TOPOLOGY_PREFERRED_ANNOTATION: "a rack"},
            f"metadata.annotations[{TOPOLOGY_PREFERRED_ANNOTATION}]",
            "node label key",
            id="preferred-not-label-key",
        ),
        pytest.param(
            "metadata.annotations",
            {TOPOLOGY_REQUIRED_ANNOTATION: "rack", GANG_TOPOLOGY_ANNOTATION: "zone"},
            f"metadata.annotations[{TOPOLOGY_REQUIRED_ANNOTATION}]",
            "differs from lattice.dev/gang-topology",
            id="required-and-alias-differ",
        ),
        pytest.param(
            "metadata.annotations",
            {GANG_TOPOLOGY_ANNOTATION: ""},
            f"metadata.annotations[{GANG_TOPOLOGY_ANNOTATION}]",
            "non-empty",
            id="topology-empty",
        ),
        pytest.param(
            "status.scheduleStartTime",
            "2025-03-01 12:00:00",
            "status.scheduleStartTime",
            "RFC 3339",
            id="time-not-rfc3339",
        ),
        pytest.param(
            "status.scheduleStartTime",
            "2025-02-30T12:00:00Z",
            "status.scheduleStartTime",
            "not a valid time",
            id="time-out-of-range",
        ),
        pytest.param(
            "status.scheduleStartTime",
            1740830400,
            "status.scheduleStartTime",
            "RFC 3339",
            id="time-as-number",
        ),
        pytest.param("metadata.name", "", "metadata.name", "needs a name", id="no-name"),
        pytest.param("metadata.generation", "3", "metadata.generation", "integer", id="gen"),
        pytest.param("spec", [], "spec", "object", id="spec-not-object"),
    ],
)
def test_bad_fields_name_themselves(path: str, value: Any, field: str, reason: str) -> None:
    with pytest.raises(InvalidObjectError) as info:
        gang_from_podgroup(_with(path, value))
    assert info.value.field == field
    message = str(info.value).replace("greater than or equal to ", ">= ")
    assert reason in message, message


def test_body_must_be_an_object() -> None:
    with pytest.raises(InvalidObjectError, match="must be an object"):
        gang_from_podgroup([])  # type: ignore[arg-type]


def test_rfc3339_round_trip_is_whole_seconds() -> None:
    assert format_rfc3339(T0 + 0.75) == T0_TEXT
    assert parse_rfc3339(format_rfc3339(T0), field="t") == T0


# --- status builder ------------------------------------------------------------------------


def _status(
    phase: str = "Pending",
    *,
    previous: dict[str, Any] | None = None,
    now: float = T0,
    start: float | None = None,
    reason: str = "Waiting",
    message: str = "2/4 members placed",
    scheduled: int = 2,
    **extra: Any,
) -> dict[str, Any]:
    return dict(
        podgroup_status(
            phase=phase,
            scheduled=scheduled,
            running=1,
            succeeded=0,
            failed=0,
            schedule_start_time=start,
            reason=reason,
            message=message,
            now=now,
            previous=previous,
            **extra,
        )
    )


def test_status_body() -> None:
    assert _status("Scheduled", start=T0 - 30, reason="Admitted", message="4/4 placed") == {
        "phase": "Scheduled",
        "scheduled": 2,
        "running": 1,
        "succeeded": 0,
        "failed": 0,
        "scheduleStartTime": "2025-03-01T11:59:30Z",
        "conditions": [
            {
                "type": SCHEDULED_CONDITION,
                "status": "True",
                "reason": "Admitted",
                "message": "4/4 placed",
                "lastTransitionTime": T0_TEXT,
            }
        ],
    }


@pytest.mark.parametrize("phase", list(PodGroupPhase))
def test_condition_status_follows_the_phase_table(phase: PodGroupPhase) -> None:
    (condition,) = _status(phase.value)["conditions"]
    assert condition["status"] == ("True" if PHASE_ADMITTED[phase] else "False")


def test_every_phase_has_a_row_and_the_upstream_names() -> None:
    assert set(PHASE_ADMITTED) == set(PodGroupPhase)
    assert {p.value for p in PodGroupPhase} == {
        "Pending",
        "PreScheduling",
        "Scheduling",
        "Scheduled",
        "Running",
        "Finished",
        "Failed",
        "Unknown",
    }
    assert [p for p, admitted in PHASE_ADMITTED.items() if admitted] == [
        PodGroupPhase.SCHEDULED,
        PodGroupPhase.RUNNING,
        PodGroupPhase.FINISHED,
    ]


def test_transition_time_is_kept_while_the_condition_status_holds() -> None:
    first = _status("Pending", now=T0)
    later = _status("Scheduling", now=T0 + 60, previous=first, reason="Partial", scheduled=3)
    (condition,) = later["conditions"]
    assert (condition["status"], condition["lastTransitionTime"]) == ("False", T0_TEXT)
    assert (condition["reason"], later["phase"]) == ("Partial", "Scheduling")


def test_transition_time_moves_when_the_condition_flips() -> None:
    waiting = _status("Pending", now=T0)
    admitted = _status("Running", now=T0 + 90, previous=waiting, reason="Admitted")
    assert admitted["conditions"][0]["lastTransitionTime"] == "2025-03-01T12:01:30Z"
    failed = _status("Failed", now=T0 + 120, previous=admitted, reason="Timeout")
    assert failed["conditions"][0]["lastTransitionTime"] == "2025-03-01T12:02:00Z"


def test_a_malformed_previous_transition_time_is_replaced() -> None:
    previous = {
        "conditions": [
            {"type": SCHEDULED_CONDITION, "status": "False", "lastTransitionTime": "yesterday"}
        ]
    }
    (condition,) = _status("Pending", now=T0 + 5, previous=previous)["conditions"]
    assert condition["lastTransitionTime"] == "2025-03-01T12:00:05Z"


@pytest.mark.parametrize("previous", [None, {}, {"conditions": "x"}, {"conditions": [1, None]}])
def test_previous_without_our_condition_starts_now(previous: dict[str, Any] | None) -> None:
    (condition,) = _status("Pending", now=T0 + 1, previous=previous)["conditions"]
    assert condition["lastTransitionTime"] == "2025-03-01T12:00:01Z"


def test_other_writers_conditions_are_kept_before_ours() -> None:
    theirs = {
        "type": "example.com/Quota",
        "status": "True",
        "reason": "Fits",
        "message": "",
        "lastTransitionTime": "2025-02-01T00:00:00Z",
        "observedGeneration": 2,
    }
    previous = {"conditions": [theirs, {"type": "Broken"}]}
    conditions = _status("Pending", previous=previous)["conditions"]
    assert [c["type"] for c in conditions] == ["example.com/Quota", SCHEDULED_CONDITION]
    assert conditions[0] == theirs


def test_observed_generation_is_recorded_when_given() -> None:
    (condition,) = _status("Pending", observed_generation=7)["conditions"]
    assert condition["observedGeneration"] == 7


def test_a_stale_start_time_is_cleared_by_the_merge_patch() -> None:
    assert "scheduleStartTime" not in _status("Pending")
    cleared = _status("Pending", previous={"scheduleStartTime": T0_TEXT})
    assert cleared["scheduleStartTime"] is None


def test_long_messages_are_truncated_to_the_condition_limit() -> None:
    (condition,) = _status("Pending", message="x" * 40_000)["conditions"]
    assert len(condition["message"]) == 32768
    assert condition["message"].endswith("...")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param({"phase": "Queued"}, "unknown PodGroup phase", id="phase"),
        pytest.param({"scheduled": -1}, "scheduled must be an int32", id="negative-count"),
        pytest.param({"scheduled": 2**31}, "scheduled must be an int32", id="count-too-big"),
        pytest.param({"reason": ""}, "CamelCase", id="empty-reason"),
        pytest.param({"reason": "not placed"}, "CamelCase", id="reason-with-space"),
    ],
)
def test_builder_refuses_caller_bugs(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _status(**kwargs)


# --- change detection ----------------------------------------------------------------------


def test_same_status_later_is_no_change() -> None:
    first = _status("Scheduling", start=T0, now=T0)
    again = _status("Scheduling", start=T0, now=T0 + 30, previous=first)
    assert not status_changed(first, again)


def test_only_transition_times_differing_is_no_change() -> None:
    first = _status("Pending", now=T0)
    fresh = _status("Pending", now=T0 + 30)  # built without previous: a new transition time
    assert fresh["conditions"] != first["conditions"]
    assert not status_changed(first, fresh)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"phase": "Scheduling"}, id="phase"),
        pytest.param({"scheduled": 3}, id="count"),
        pytest.param({"reason": "Unschedulable"}, id="reason"),
        pytest.param({"message": "3/4 members placed"}, id="message"),
        pytest.param({"start": T0 + 1}, id="start-time"),
        pytest.param({"observed_generation": 2}, id="generation"),
    ],
)
def test_changes_that_matter(change: dict[str, Any]) -> None:
    current = _status("Pending", start=T0)
    assert status_changed(current, _status(**{"phase": "Pending", "start": T0, **change}))


@pytest.mark.parametrize("stored", ["2025-03-01T13:00:00+01:00", "2025-03-01T12:00:00.400Z"])
def test_start_time_compares_as_an_instant(stored: str) -> None:
    current = _status("Pending", start=T0) | {"scheduleStartTime": stored}
    assert not status_changed(current, _status("Pending", start=T0 + 0.5))
    assert status_changed(current, _status("Pending", start=T0 + 1))


def test_clearing_the_start_time_is_a_change_until_it_is_gone() -> None:
    current = _status("Pending", start=T0)
    desired = _status("Pending", previous=current)
    assert status_changed(current, desired)
    after = {k: v for k, v in current.items() if k != "scheduleStartTime"}
    assert not status_changed(after, desired)


def test_fields_we_do_not_write_are_ignored() -> None:
    current = _status("Pending") | {"occupiedBy": "job-uid"}
    assert not status_changed(current, _status("Pending"))


def test_upstream_controller_status_needs_one_write() -> None:
    """Go omits zero counts; our explicit zeros and condition are written once, then stable."""
    upstream = {"phase": "Pending", "running": 1, "occupiedBy": "x"}
    desired = _status("Pending")
    assert status_changed(upstream, desired)
    assert status_changed(None, desired)


def test_pruned_fields_are_detected_and_then_ignored() -> None:
    """Under upstream's CRD the server drops scheduled and conditions: no write loop."""
    desired = _status("Pending", start=T0)
    stored = {k: v for k, v in desired.items() if k not in ("scheduled", "conditions")}
    pruned = pruned_fields(desired, stored)
    assert pruned == {"scheduled", "conditions"}
    assert status_changed(stored, desired)
    assert not status_changed(stored, desired, pruned=pruned)
    assert pruned_fields(desired, desired) == frozenset()
    assert pruned_fields(_status("Pending", previous=desired), {}) == frozenset(
        {"phase", "scheduled", "running", "succeeded", "failed", "conditions"}
    )


# --- the CRD -------------------------------------------------------------------------------


def _crd() -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return crd


def _schema() -> dict[str, Any]:
    return object_schema(_crd())


def test_crd_identity() -> None:
    crd = _crd()
    assert crd["metadata"]["name"] == f"{PLURAL}.{GROUP}"
    assert crd["metadata"]["annotations"] == {
        "api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/scheduler-plugins/pull/50"
    }
    spec = crd["spec"]
    assert (spec["group"], spec["scope"]) == (GROUP, "Namespaced")
    assert spec["names"] == {
        "kind": KIND,
        "listKind": "PodGroupList",
        "plural": PLURAL,
        "singular": "podgroup",
        "shortNames": ["pg", "pgs"],
    }
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == (VERSION, True, True)
    assert version["subresources"] == {"status": {}}
    assert CRD_PATH.read_text().startswith("# PodGroup")
    assert "SKIP THIS FILE" in CRD_PATH.read_text().split("apiVersion:")[0]


# Upstream's schema, node by node (manifests/coscheduling/crd.yaml, controller-gen v0.14).
_UPSTREAM: dict[str, dict[str, Any]] = {
    "spec.minMember": {"type": "integer", "format": "int32", "minimum": 1},
    "spec.minResources": {"type": "object"},
    "spec.scheduleTimeoutSeconds": {"type": "integer", "format": "int32"},
    "status.phase": {"type": "string"},
    "status.occupiedBy": {"type": "string"},
    "status.running": {"type": "integer", "format": "int32"},
    "status.succeeded": {"type": "integer", "format": "int32"},
    "status.failed": {"type": "integer", "format": "int32"},
    "status.scheduleStartTime": {"type": "string", "format": "date-time"},
}
_CONSTRAINTS = ("type", "format", "minimum", "maximum", "pattern", "enum", "required")


def test_upstream_fields_are_all_there_and_unchanged() -> None:
    schema = _schema()
    assert set(schema["properties"]) == {"apiVersion", "kind", "metadata", "spec", "status"}
    spec = schema["properties"]["spec"]
    status = schema["properties"]["status"]
    assert set(spec["properties"]) == {"minMember", "minResources", "scheduleTimeoutSeconds"}
    assert set(status["properties"]) == {
        "phase",
        "occupiedBy",
        "running",
        "succeeded",
        "failed",
        "scheduleStartTime",
        "scheduled",
        "conditions",
    }
    for path, expected in _UPSTREAM.items():
        section, name = path.split(".")
        node = schema["properties"][section]["properties"][name]
        assert {k: node[k] for k in _CONSTRAINTS if k in node} == expected, path
    assert "required" not in spec
    assert "required" not in status
    assert spec["properties"]["minResources"]["additionalProperties"] == {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
        r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
        "x-kubernetes-int-or-string": True,
    }


def test_our_additions_are_optional_and_typed() -> None:
    status = _schema()["properties"]["status"]["properties"]
    assert status["scheduled"]["type"] == "integer"
    conditions = status["conditions"]
    assert conditions["type"] == "array"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert set(conditions["items"]["required"]) == {
        "type",
        "status",
        "reason",
        "message",
        "lastTransitionTime",
    }


def test_built_statuses_fit_the_schema() -> None:
    status_schema = _schema()["properties"]["status"]
    for phase in PodGroupPhase:
        body = _status(phase.value, start=T0, observed_generation=1)
        assert validate(body, status_schema, "status") == [], phase


def test_schema_catches_what_the_builder_would_never_write() -> None:
    status_schema = _schema()["properties"]["status"]
    body = _status("Pending")
    broken = copy.deepcopy(body)
    broken["conditions"][0]["status"] = "Maybe"
    assert validate(broken, status_schema) != []
    broken = copy.deepcopy(body)
    broken["conditions"][0]["reason"] = "has spaces"
    assert validate(broken, status_schema) != []
    assert validate(body | {"scheduled": -1}, status_schema) != []


def test_printer_columns_point_at_real_fields() -> None:
    (version,) = _crd()["spec"]["versions"]
    obj = training_operator_podgroup()
    obj["metadata"]["creationTimestamp"] = "2025-03-01T11:00:00Z"
    obj["status"] = _status("Scheduling", scheduled=3)
    values: dict[str, Any] = {}
    wide: list[str] = []
    for column in version["additionalPrinterColumns"]:
        value: Any = obj
        for key in column["jsonPath"].lstrip(".").split("."):
            value = value[key]
        values[column["name"]] = value
        if column.get("priority", 0) > 0:
            wide.append(column["name"])
    assert values == {
        "Phase": "Scheduling",
        "MinMember": 4,
        "Scheduled": 3,
        "Running": 1,
        "Succeeded": 0,
        "Failed": 0,
        "Age": "2025-03-01T11:00:00Z",
    }
    assert wide == ["Succeeded", "Failed"]

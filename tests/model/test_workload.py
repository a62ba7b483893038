"""Kubernetes' own PodGroup (scheduling.k8s.io/v1beta1) read as a gang, and the condition
Lattice writes on it as kube-scheduler does."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.control.gangs import gang_of
from scheduler.model.errors import InvalidObjectError
from scheduler.model.workload import (
    INITIALLY_SCHEDULED,
    UPSTREAM_PREFIX,
    gang_from_upstream,
    initially_scheduled_status,
    is_upstream,
    object_name,
)

RACK = "example.com/rack"


def group(spec: dict[str, Any], **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "train", "namespace": "ml", "uid": "u1", "annotations": annotations},
        "spec": spec,
    }


def test_a_gang_policy_with_a_topology_key_is_a_required_level() -> None:
    spec = gang_from_upstream(
        group(
            {
                "schedulingPolicy": {"gang": {"minCount": 8}},
                "schedulingConstraints": {"topology": [{"key": RACK}]},
            },
            **{"lattice.dev/topology-preferred": "kubernetes.io/hostname"},
        )
    )
    assert spec.key == f"ml/{UPSTREAM_PREFIX}train"
    assert (spec.min_member, spec.topology_key, spec.topology_preferred) == (
        8,
        RACK,
        "kubernetes.io/hostname",
    )
    assert spec.uid == "u1"
    assert is_upstream(spec.name)
    assert object_name(spec.name) == "train"


def test_a_basic_policy_is_a_gang_of_one() -> None:
    spec = gang_from_upstream(group({"schedulingPolicy": {"basic": {}}}))
    assert (spec.min_member, spec.topology_key) == (1, None)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"schedulingPolicy": {}}, "spec.schedulingPolicy"),
        ({"schedulingPolicy": {"gang": {}}}, "spec.schedulingPolicy.gang.minCount"),
        ({"schedulingPolicy": {"gang": {"minCount": 0}}}, "spec.minMember"),
        (
            {
                "schedulingPolicy": {"basic": {}},
                "schedulingConstraints": {"topology": [{"key": RACK}, {"key": "zone"}]},
            },
            "spec.schedulingConstraints.topology",
        ),
        (
            {
                "schedulingPolicy": {"basic": {}},
                "schedulingConstraints": {"topology": [{"key": "not a key"}]},
            },
            "lattice.dev/topology-required",
        ),
    ],
)
def test_what_lattice_cannot_honour_is_refused_naming_the_field(
    spec: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidObjectError, match=field.replace(".", r"\.")):
        gang_from_upstream(group(spec))


def test_the_annotation_and_the_topology_key_must_agree() -> None:
    body = group(
        {
            "schedulingPolicy": {"basic": {}},
            "schedulingConstraints": {"topology": [{"key": RACK}]},
        },
        **{"lattice.dev/topology-required": "zone"},
    )
    with pytest.raises(InvalidObjectError, match="differs from"):
        gang_from_upstream(body)


def test_pods_name_their_group_by_label_or_by_scheduling_group() -> None:
    upstream = {"metadata": {"namespace": "ml"}, "spec": {"schedulingGroup": {"podGroupName": "a"}}}
    assert gang_of(upstream) == f"ml/{UPSTREAM_PREFIX}a"
    labelled = {
        "metadata": {"namespace": "ml", "labels": {"scheduling.x-k8s.io/pod-group": "a"}},
        "spec": {"schedulingGroup": {"podGroupName": "b"}},
    }
    assert gang_of(labelled) == "ml/a"  # scheduler-plugins' label first
    assert gang_of({"metadata": {"namespace": "ml"}, "spec": {}}) is None


def test_the_condition_turns_true_once_and_stays() -> None:
    failed = initially_scheduled_status(
        admitted=False, reason="Unschedulable", message="3/4 members fit", now=100.0, previous=None
    )
    (cond,) = failed["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        INITIALLY_SCHEDULED,
        "False",
        "Unschedulable",
    )
    again = initially_scheduled_status(
        admitted=False, reason="Unschedulable", message="2/4", now=200.0, previous=failed
    )
    assert again["conditions"][0]["lastTransitionTime"] == cond["lastTransitionTime"]
    other = {"type": "DisruptionTarget", "status": "False", "reason": "X", "message": ""}
    done = initially_scheduled_status(
        admitted=True,
        reason="Unschedulable",
        message="placed",
        now=300.0,
        previous={"conditions": [other, *again["conditions"]]},
    )
    assert done["conditions"][0] == other
    assert (done["conditions"][1]["status"], done["conditions"][1]["reason"]) == (
        "True",
        "Scheduled",
    )
    later = initially_scheduled_status(
        admitted=False, reason="Unschedulable", message="evicted", now=400.0, previous=done
    )
    assert later == done, "True is terminal, as kube-scheduler keeps it"

"""`lattice explain --gang` on a partial gang: how long it jumps the queue, and why."""

from __future__ import annotations

from typing import Any

from scheduler.control.explain import explain_gang, gang_json, render_gang
from scheduler.core.load import LoadView
from scheduler.core.profile import DEFAULT_PROFILE
from scheduler.core.schedule import framework_for
from scheduler.core.topology.state import TopologyState
from scheduler.predict import LoadPredictor
from tests.builders import cluster, make_node, make_pod

LABEL = "scheduling.x-k8s.io/pod-group"


def group(timeout_s: int | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"minMember": 3}
    if timeout_s is not None:
        spec["scheduleTimeoutSeconds"] = timeout_s
    return {"metadata": {"name": "g", "namespace": "default", "uid": "u"}, "spec": spec}


def pods(phases: dict[str, str | None]) -> list[dict[str, Any]]:
    """Members by name: a phase for a bound one (on n0), None for a pending one."""
    bodies = []
    for name, phase in phases.items():
        body = make_pod(name, "1").label(LABEL, "g").obj()
        body["spec"]["schedulerName"] = "lattice"
        if phase is not None:
            body["spec"]["nodeName"] = "n0"
            body["status"] = {"phase": phase}
        bodies.append(body)
    return bodies


def explained(bodies: list[dict[str, Any]], timeout_s: int | None, boost_s: int = 60) -> Any:
    snapshot = cluster([make_node("n0", cpu="8", memory="16Gi")], [])
    return explain_gang(
        group(timeout_s),
        bodies,
        framework_for(DEFAULT_PROFILE),
        snapshot,
        topology=TopologyState(),
        load=LoadView(LoadPredictor(DEFAULT_PROFILE.load_aware.predict), 0.0),
        seed=0,
        scheduler_name="lattice",
        time_limit_s=1.0,
        use_solver=False,
        partial_boost_s=boost_s,
    )


def test_a_partial_gang_says_how_long_it_ranks_first() -> None:
    gang = explained(pods({"a": "Running", "b": None, "c": None}), None)
    text = render_gang(gang)
    assert "partial: 1/3 members placed" in text
    assert "for at most 60 s" in text
    assert "the PodGroup sets no scheduleTimeoutSeconds" in text
    assert gang_json(gang)["partialBoostSeconds"] == 60
    gang = explained(pods({"a": "Running", "b": None, "c": None}), 15)
    assert "for at most 15 s from the moment it became partial (its scheduleTimeoutSeconds)" in (
        render_gang(gang)
    )
    assert explained(pods({"a": "Running", "b": None, "c": None}), None, 7).partial_boost_s == 7


def test_a_gang_that_is_not_partial_says_nothing_of_a_boost() -> None:
    cases: list[dict[str, str | None]] = [
        {"a": None, "b": None, "c": None},  # nothing placed
        {"a": "Running", "b": "Running", "c": "Running"},  # admitted
        {"a": "Succeeded", "b": None, "c": None},  # finished members hold nothing
    ]
    for phases in cases:
        gang = explained(pods(phases), None)
        assert gang.partial_boost_s is None, phases
        assert "partial:" not in render_gang(gang)
        assert gang_json(gang)["partialBoostSeconds"] is None

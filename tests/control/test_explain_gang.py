"""`lattice explain --gang` on a partial gang: how long it jumps the queue, and why."""

from __future__ import annotations

from typing import Any

from scheduler.control.explain import GangExplained, explain_gang, gang_json, render_gang
from scheduler.core.load import LoadView
from scheduler.core.profile import DEFAULT_PROFILE
from scheduler.core.schedule import framework_for
from scheduler.core.snapshot import Snapshot
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


def explained(
    bodies: list[dict[str, Any]],
    timeout_s: int | None,
    boost_s: int = 60,
    *,
    body: dict[str, Any] | None = None,
    snapshot: Snapshot | None = None,
    levels: tuple[str, ...] = (),
) -> GangExplained:
    return explain_gang(
        body or group(timeout_s),
        bodies,
        framework_for(DEFAULT_PROFILE),
        snapshot or cluster([make_node("n0", cpu="8", memory="16Gi")], []),
        topology=TopologyState(),
        load=LoadView(LoadPredictor(DEFAULT_PROFILE.load_aware.predict), 0.0),
        seed=0,
        scheduler_name="lattice",
        time_limit_s=1.0,
        use_solver=bool(levels),
        partial_boost_s=boost_s,
        levels=levels,
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


def test_a_required_rack_gang_shows_each_level_and_why_racks_were_refused() -> None:
    """Rack r1: one node of 2 cpu, r2: two; a gang of 3 x 1 cpu requiring one rack: r2 is chosen, r1
    refused short by one member; the block level shows both racks' block."""
    nodes = [
        make_node(name, cpu=cpu, memory="16Gi")
        .label("example.com/block", "b1")
        .label("example.com/rack", rack)
        for name, cpu, rack in (("n0", "2", "r1"), ("n1", "2", "r2"), ("n2", "2", "r2"))
    ]
    body = group(None)
    body["metadata"]["annotations"] = {"lattice.dev/topology-required": "example.com/rack"}
    gang = explained(
        pods({"a": None, "b": None, "c": None}),
        None,
        body=body,
        snapshot=cluster(nodes, []),
        levels=("example.com/block", "example.com/rack"),
    )
    assert gang.plan.admitted
    text = render_gang(gang)
    assert "level example.com/block\n" in text
    assert "level example.com/rack (required)\n" in text
    rack_rows = text.split("level example.com/rack (required)\n", 1)[1].splitlines()
    assert rack_rows[1].split() == ["r2", "2", "4", "0", "3", "chosen:", "3", "members"]
    assert rack_rows[2].split()[:4] == ["r1", "1", "2", "0"]
    assert rack_rows[2].endswith("refused: holds 2 of 3 members (short 1) in one example.com/rack")
    levels = gang_json(gang)["levels"]
    assert [v["key"] for v in levels] == ["example.com/block", "example.com/rack"]
    assert levels[0]["domains"] == [
        {
            "name": "b1",
            "nodes": 3,
            "room": 6,
            "gpusFree": 0,
            "planned": 3,
            "verdict": "chosen: 3 members",
        }
    ]

"""Cycles that count nominated pods (kube's RunFilterPluginsWithNominatedPods): a node
passes only with and without the nominated pods of >= priority; blocked nodes are
Unschedulable with the reasons of the run that blocked them; the snapshot is restored."""

from __future__ import annotations

from scheduler.core.framework import Code
from scheduler.core.nominated import nominated_by_node, schedule_with_nominated
from scheduler.core.schedule import Framework
from tests.builders import cluster, make_node, make_pod


def test_a_nominated_pod_holds_its_node_and_the_other_node_wins() -> None:
    snap = cluster([make_node("a", cpu="4"), make_node("b", cpu="2")], [])
    nominee = make_pod("n", "3").priority(100).build()
    pod = make_pod("p", "2").priority(10).build()
    plain = Framework().schedule(snap, pod)
    assert plain.selected == "a"  # LeastAllocated: the emptier node
    d = schedule_with_nominated(Framework(), snap, pod, [(nominee, "a")])
    assert d.selected == "b"
    assert d.feasible == ("b",)
    verdict = d.explanation.node("a")
    assert (verdict.plugin, verdict.reasons, verdict.code) == (
        "NodeResourcesFit",
        ("Insufficient cpu",),
        Code.UNSCHEDULABLE,
    )
    assert d.summary == "1/2 nodes are available: 1 Insufficient cpu."
    assert snap.node_of_pod(nominee.key) is None
    assert [list(snap.pods_on(i)) for i in range(2)] == [[], []]


def test_every_feasible_node_blocked_is_an_unschedulable_failure() -> None:
    snap = cluster([make_node("a", cpu="4"), make_node("b", cpu="1")], [])
    nominee = make_pod("n", "3").priority(100).build()
    pod = make_pod("p", "2").priority(100).build()  # equal priority: held back too
    d = schedule_with_nominated(Framework(), snap, pod, [(nominee, "a")])
    assert d.selected is None
    assert d.code is Code.UNSCHEDULABLE
    assert d.summary == "0/2 nodes are available: 2 Insufficient cpu."


def test_what_does_not_count() -> None:
    placed = make_pod("placed", "1").priority(50).build()
    snap = cluster([make_node("a", cpu="4")], [(placed, "a")])
    pod = make_pod("p", "2").priority(10).build()
    lower = make_pod("lower", "4").priority(5).build()
    elsewhere = make_pod("gone", "4").priority(50).build()
    nominated = [(lower, "a"), (pod, "a"), (placed, "a"), (elsewhere, "no-such-node")]
    assert nominated_by_node(snap, pod, nominated) == {}
    assert schedule_with_nominated(Framework(), snap, pod, nominated).selected == "a"

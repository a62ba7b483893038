"""Gang solves count other pods' nominations as kube's filters do for a pod: those of
equal or higher priority hold their node's room; lower ones and the gang's own do not."""

from __future__ import annotations

from scheduler.solver import build_problem, solve
from tests.builders import cluster, make_node, make_pod
from tests.solver.support import assert_valid, built, framework, gang, member


def test_a_nomination_of_equal_priority_holds_its_nodes_room() -> None:
    """Three members of 2 CPU on two 4-CPU nodes fit (2 + 1) until a pending pod of the
    same priority is nominated to n0 with 3 CPU: then only n1's two fit, and the solve must
    say so (before, it planned n0 and the commit, which honours the nomination, failed)."""
    snapshot = cluster([make_node("n0", cpu="4"), make_node("n1", cpu="4")])
    members = built([member(f"m{i}", cpu="2") for i in range(3)])
    holder = make_pod("holder", cpu="3").build()
    spec = gang(min_member=3)
    free = build_problem(framework(), snapshot, spec, members, need=3)
    assert solve(free, time_limit_s=10.0).admitted
    held = build_problem(framework(), snapshot, spec, members, need=3, nominated=[(holder, "n0")])
    plan = solve(held, time_limit_s=10.0)
    assert not plan.admitted, plan.message
    assert plan.placed == 2
    assert snapshot.pod_counts.sum() == 0, "the nominated pod was taken out again"

    two = build_problem(
        framework(), snapshot, gang(min_member=2), members[:2], need=2, nominated=[(holder, "n0")]
    )
    placed = solve(two, time_limit_s=10.0)
    assert placed.admitted, placed.message
    assert {node for _, node in placed.placements} == {"n1"}
    assert_valid(snapshot, members[:2], two, placed)


def test_lower_priority_and_own_nominations_do_not_count() -> None:
    snapshot = cluster([make_node("n0", cpu="4"), make_node("n1", cpu="4")])
    members = built([member(f"m{i}", cpu="2").priority(10) for i in range(3)])
    low = make_pod("low", cpu="3").priority(5).build()
    spec = gang(min_member=3)
    lower = build_problem(framework(), snapshot, spec, members, need=3, nominated=[(low, "n0")])
    assert solve(lower, time_limit_s=10.0).admitted
    own = build_problem(
        framework(), snapshot, spec, members, need=3, nominated=[(members[0], "n0")]
    )
    assert solve(own, time_limit_s=10.0).admitted
    high = make_pod("high", cpu="3").priority(10).build()
    equal = build_problem(framework(), snapshot, spec, members, need=3, nominated=[(high, "n0")])
    assert not solve(equal, time_limit_s=10.0).admitted

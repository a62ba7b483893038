"""Members whose required pod affinity selects another member class but not themselves
(an MPI launcher and its workers): placed with the members they select, anchors first."""

from __future__ import annotations

import numpy as np

from lattice_dev.solver.naive import solve_naive
from scheduler.model.names import LABEL_HOSTNAME
from scheduler.solver import SolveStatus, greedy, solve, violations
from tests.builders import PodBuilder, cluster, make_node
from tests.solver.support import built, counts_of, member, plan_for, problem_for, replay

LAUNCHER = {"role": "launcher"}
WORKER = {"role": "worker"}


def launcher(cpu: str = "1") -> PodBuilder:
    return member("launcher", cpu=cpu).label("role", "launcher")


def worker(i: int, key: str = LABEL_HOSTNAME) -> PodBuilder:
    return member(f"worker-{i}").label("role", "worker").pod_affinity(key, LAUNCHER)


def test_workers_with_affinity_to_the_launcher_go_to_its_node() -> None:
    snapshot = cluster([make_node(f"n{i}", cpu="8", memory="32Gi") for i in range(3)])
    members = built([*(worker(i) for i in range(4)), launcher()])
    _, plan = plan_for(snapshot, members)
    assert plan.admitted, plan.message
    assert plan.placed == 5
    assert len({node for _, node in plan.placements}) == 1
    assert replay(snapshot, members, plan) == [], "the commit order places the launcher first"


def test_zone_affinity_keeps_workers_in_the_launchers_zone() -> None:
    snapshot = cluster(
        [
            make_node("a1", cpu="3", memory="32Gi").label("zone", "a"),
            make_node("a2", cpu="3", memory="32Gi").label("zone", "a"),
            make_node("b1", cpu="2", memory="32Gi").label("zone", "b"),
            make_node("u1", cpu="64", memory="256Gi"),
        ]
    )
    members = built([launcher(), *(worker(i, "zone") for i in range(4))])
    _, plan = plan_for(snapshot, members)
    assert plan.admitted, plan.message
    nodes = sorted(node for _, node in plan.placements)
    assert len(nodes) == 5
    assert set(nodes) <= {"a1", "a2"}
    assert replay(snapshot, members, plan) == []


def test_a_launcher_with_affinity_to_its_workers() -> None:
    snapshot = cluster([make_node(f"n{i}", cpu="8", memory="32Gi") for i in range(2)])
    boss = launcher().pod_affinity(LABEL_HOSTNAME, WORKER)
    workers = [member(f"worker-{i}").label("role", "worker") for i in range(4)]
    members = built([boss, *workers])
    _, plan = plan_for(snapshot, members)
    assert plan.admitted, plan.message
    assert len({node for _, node in plan.placements}) == 1
    assert replay(snapshot, members, plan) == []


def test_workers_never_go_without_a_launcher() -> None:
    """minMember 4 of 5: four workers would fit, but no launcher fits, so none may go."""
    snapshot = cluster([make_node(f"n{i}", cpu="8", memory="32Gi") for i in range(2)])
    members = built([launcher(cpu="16"), *(worker(i) for i in range(4))])
    problem, plan = plan_for(snapshot, members, need=4)
    assert not plan.admitted
    assert plan.status is SolveStatus.INFEASIBLE, plan.message
    follower = problem.member_class[1]
    n0 = problem.node_names.index("n0")
    alone = np.zeros((problem.num_classes, problem.num_nodes), dtype=np.int64)
    alone[follower, n0] = 4
    assert violations(problem, alone) != [], "followers without an anchor break a rule"


def test_greedy_places_the_launcher_before_workers_that_arrived_first() -> None:
    snapshot = cluster([make_node(f"n{i}", cpu="8", memory="32Gi") for i in range(3)])
    members = built([*(worker(i) for i in range(4)), launcher()])
    problem = problem_for(snapshot, members)
    hint = greedy(problem)
    assert hint.placed == 5
    assert violations(problem, hint.counts) == []
    plan = solve(problem, use_solver=False)
    assert plan.status is SolveStatus.GREEDY, plan.message
    assert plan.placements[0][0] == 4, "the launcher is committed first"
    assert replay(snapshot, members, plan) == []
    assert violations(problem, counts_of(problem, plan)) == []


def test_the_naive_model_agrees() -> None:
    snapshot = cluster([make_node(f"n{i}", cpu=str(4 + i), memory="32Gi") for i in range(3)])
    members = built([launcher(), *(worker(i) for i in range(3))])
    merged = problem_for(snapshot, members)
    unmerged = problem_for(snapshot, members, merge=False)
    plan = solve(merged, time_limit_s=10.0)
    naive = solve_naive(unmerged, time_limit_s=10.0)
    assert plan.admitted
    assert plan.placed == 4
    assert naive.counts is not None
    assert int(naive.counts.sum()) == 4
    assert violations(unmerged, naive.counts) == []
    assert naive.objective == plan.objective

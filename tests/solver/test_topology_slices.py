"""Slices (tensor-parallel groups of N), each inside one domain of a level: in greedy and
in CP-SAT, with required and preferred levels, for a partial gang, and the checker that
refuses a plan breaking them. Every admitted plan's slices are checked here from the node
labels alone (each slice N members, all on nodes of one rack)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from lattice_dev.solver.naive import solve_naive
from scheduler.solver import SolveStatus, solve, violations
from scheduler.solver.check import slice_assignment_violations, spans
from scheduler.solver.problem import GangProblem
from scheduler.solver.solve import GangPlan
from tests.builders import cluster
from tests.solver.support import counts_of, gang, gpu_node, plan_for, problem_for
from tests.solver.test_topology_levels import BLOCK, LEVELS, RACK, gpu_members, racks


def slices_by_rack(plan: GangPlan, rack_of: Mapping[str, str]) -> dict[int, list[str]]:
    """Per slice of the plan, the racks of its members' nodes (one entry a member)."""
    node = dict(plan.placements)
    out: dict[int, list[str]] = defaultdict(list)
    for member, k in plan.slices:
        out[k].append(rack_of[node[member]])
    return dict(out)


def assert_slices(plan: GangPlan, rack_of: Mapping[str, str], size: int) -> None:
    """Every placed member has a slice; every slice is ``size`` members in one rack."""
    assert plan.admitted
    assert sorted(m for m, _ in plan.slices) == sorted(m for m, _ in plan.placements)
    groups = slices_by_rack(plan, rack_of)
    assert sorted(groups) == list(range(len(plan.placements) // size))
    for k, where in groups.items():
        assert len(where) == size, (k, where)
        assert len(set(where)) == 1, (k, where)


def whole_slices(layout: Mapping[str, Mapping[str, Sequence[int]]], gpus: int, size: int) -> int:
    """From the layout alone: the slices of ``size`` members the racks hold in all."""
    return sum(sum(g // gpus for g in ns) // size for rs in layout.values() for ns in rs.values())


# Racks of 3 members each (2 GPUs a member): 6 members fit, but slices of 2 only 2 + 2.
LAYOUT_ODD = {"b1": {"rA": [4, 2], "rB": [6]}}


@pytest.mark.parametrize("use_solver", [True, False], ids=["cpsat", "greedy"])
def test_slices_each_in_one_rack(use_solver: bool) -> None:
    snapshot, rack_of = racks(LAYOUT_ODD)
    spec = gang(min_member=4, slice_size=2, slice_key=RACK)
    problem, plan = plan_for(
        snapshot, gpu_members(4), spec=spec, levels=LEVELS, use_solver=use_solver
    )
    assert_slices(plan, rack_of, 2)
    assert "2 slices of 2 each in one example.com/rack" in plan.message
    assert violations(problem, counts_of(problem, plan)) == []


@pytest.mark.parametrize("use_solver", [True, False], ids=["cpsat", "greedy"])
def test_slices_that_fit_nowhere_bind_nothing_and_say_why(use_solver: bool) -> None:
    snapshot, _ = racks(LAYOUT_ODD)
    members = gpu_members(6)
    # Without slices the six fit (3 + 3) ...
    _, loose = plan_for(snapshot, members, spec=gang(min_member=6), use_solver=use_solver)
    assert loose.admitted
    # ... with slices of 2 the racks hold 2 slices, the gang needs 3.
    spec = gang(min_member=6, slice_size=2, slice_key=RACK)
    _, plan = plan_for(snapshot, members, spec=spec, levels=LEVELS, use_solver=use_solver)
    assert whole_slices(LAYOUT_ODD, 2, 2) == 2
    assert not plan.admitted
    assert plan.placements == ()
    assert plan.slices == ()
    if use_solver:
        assert plan.status is SolveStatus.INFEASIBLE
    assert (
        f"needs 3 slices of 2 members, each in one {RACK}; the domains hold 2 whole slices "
        f"(the most members in one: 3" in plan.message
    ), plan.message


@pytest.mark.parametrize("use_solver", [True, False], ids=["cpsat", "greedy"])
def test_slices_within_the_required_block(use_solver: bool) -> None:
    # Block b1 holds exactly 6 members (3 + 3, the tight choice without slices) but only
    # 2 slices of 2; block b2 (4 + 2) holds 3.
    layout = {"b1": {"r11": [6], "r12": [6]}, "b2": {"r21": [8], "r22": [4, 2]}}
    snapshot, rack_of = racks(layout)
    members = gpu_members(6)
    _, plain = plan_for(
        snapshot,
        members,
        spec=gang(min_member=6, topology_key=BLOCK),
        levels=LEVELS,
        use_solver=use_solver,
    )
    assert plain.domain == "b1"
    spec = gang(min_member=6, topology_key=BLOCK, slice_size=2, slice_key=RACK)
    _, plan = plan_for(snapshot, members, spec=spec, levels=LEVELS, use_solver=use_solver)
    assert plan.domain == "b2"
    assert_slices(plan, rack_of, 2)


@pytest.mark.parametrize("use_solver", [True, False], ids=["cpsat", "greedy"])
def test_slices_with_preferred_rack_span_the_fewest(use_solver: bool) -> None:
    # One block; racks hold 5, 4 and 4 members. 8 members in slices of 4 need two racks;
    # rA's fifth place is no use to a slice.
    layout = {"b1": {"rA": [8, 2], "rB": [8], "rC": [4, 4]}}
    snapshot, rack_of = racks(layout)
    spec = gang(min_member=8, preferred=RACK, slice_size=4, slice_key=RACK)
    problem, plan = plan_for(
        snapshot, gpu_members(8), spec=spec, levels=LEVELS, use_solver=use_solver
    )
    assert_slices(plan, rack_of, 4)
    assert spans(problem, counts_of(problem, plan))[-1] == 2


def test_partial_gang_completes_its_bound_slice() -> None:
    # A slice of 2 in rA has one member bound (slice 0); three members arrive: one
    # completes slice 0 in rA, the other two form slice 1 in one rack.
    layout = {"b1": {"rA": [2, 2], "rB": [4]}}
    snapshot, rack_of = racks(layout)
    members = gpu_members(3)
    spec = gang(min_member=4, slice_size=2, slice_key=RACK)
    for use_solver in (True, False):
        problem = problem_for(snapshot, members, spec=spec, levels=LEVELS, slice_bound=[("rA", 0)])
        assert list(problem.slice_short) == [1, 0]
        plan = solve(problem, time_limit_s=10.0, use_solver=use_solver)
        assert plan.admitted, plan.message
        groups = slices_by_rack(plan, rack_of)
        assert groups[0] == ["rA"]
        assert len(groups[1]) == 2
        assert len(set(groups[1])) == 1
        assert violations(problem, counts_of(problem, plan)) == []


def test_a_slice_level_that_is_no_level_rejects_the_gang() -> None:
    snapshot, _ = racks(LAYOUT_ODD)
    spec = gang(min_member=2, slice_size=2, slice_key=RACK)
    problem = problem_for(snapshot, gpu_members(2), spec=spec, levels=(BLOCK,))
    assert problem.rejection == f"slice level {RACK} is not one of spec.topology.levels"
    plan = solve(problem)
    assert not plan.admitted
    assert "is not one of spec.topology.levels" in plan.message


def _problem() -> tuple[GangProblem, dict[str, str]]:
    snapshot, rack_of = racks({"b1": {"rA": [4, 4], "rB": [4]}})
    spec = gang(min_member=4, slice_size=2, slice_key=RACK)
    return problem_for(snapshot, gpu_members(4), spec=spec, levels=LEVELS), rack_of


def test_checker_rejects_a_plan_breaking_slices() -> None:
    problem, rack_of = _problem()
    index = {name: n for n, name in enumerate(problem.node_names)}
    counts = np.zeros((problem.num_classes, problem.num_nodes), dtype=np.int64)
    # Three members in rack A, one in rack B: no split into slices of 2 inside one rack.
    counts[0, index["rA-n0"]] = 2
    counts[0, index["rA-n1"]] = 1
    counts[0, index["rB-n0"]] = 1
    broken = violations(problem, counts)
    assert f"{RACK}=rA: 3 members, not whole slices of 2" in broken
    assert f"{RACK}=rB: 1 members, not whole slices of 2" in broken
    # The same nodes two and two are fine.
    counts[0, index["rA-n1"]] = 0
    counts[0, index["rB-n0"]] = 2
    assert violations(problem, counts) == []
    # An explicit split: a slice over two racks, and a slice of 3, are refused.
    placed = [(0, index["rA-n0"]), (1, index["rA-n0"]), (2, index["rB-n0"]), (3, index["rB-n0"])]
    assert slice_assignment_violations(problem, placed, {0: 0, 1: 0, 2: 1, 3: 1}) == []
    mixed = slice_assignment_violations(problem, placed, {0: 0, 1: 1, 2: 0, 3: 1})
    assert f"slice 0 spans 2 domains of {RACK}" in mixed
    uneven = slice_assignment_violations(problem, placed, {0: 0, 1: 0, 2: 0, 3: 1})
    assert "slice 0: 3 members, not 2" in uneven
    assert "member 3: placed without a slice" in slice_assignment_violations(
        problem, placed, {0: 0, 1: 0, 2: 1}
    )
    assert rack_of["rB-n0"] == "rB"


def test_members_never_go_to_nodes_without_the_slice_level() -> None:
    # A node without the rack label is in no rack: a slice cannot be inside one there.
    snapshot = cluster(
        [gpu_node("bare", 8), gpu_node("rA-n0", 4).label(BLOCK, "b1").label(RACK, "rA")]
    )
    spec = gang(min_member=2, slice_size=2, slice_key=RACK)
    problem = problem_for(snapshot, gpu_members(4), need=2, spec=spec, levels=LEVELS)
    assert not problem.limit[:, problem.node_names.index("bare")].any()
    plan = solve(problem, time_limit_s=10.0)
    assert plan.admitted
    assert {n for _, n in plan.placements} == {"rA-n0"}


@pytest.mark.parametrize("seed", range(10))
def test_admitted_exactly_when_the_racks_hold_the_slices(seed: int) -> None:
    """CP-SAT admits iff the racks hold the slices (counted from the layout alone, about
    half the seeds do), and proves it when not; greedy never admits more; every admitted
    plan's slices hold."""
    rng = np.random.default_rng(seed)
    size = int(rng.choice([2, 3, 4]))
    layout = {
        f"b{b}": {f"r{b}{r}": [int(g) for g in rng.choice([0, 2, 4, 6], size=2)] for r in range(3)}
        for b in range(2)
    }
    snapshot, rack_of = racks(layout)
    room = sum(g // 2 for rs in layout.values() for gs in rs.values() for g in gs)
    slices = max(1, room // size - int(rng.integers(0, 2)))  # as many as the GPUs allow
    members = gpu_members(slices * size)
    spec = gang(min_member=slices * size, slice_size=size, slice_key=RACK)
    fits = whole_slices(layout, 2, size) >= slices
    _, exact = plan_for(snapshot, members, spec=spec, levels=LEVELS)
    assert exact.admitted == fits, exact.message
    if not fits:
        assert exact.status is SolveStatus.INFEASIBLE
        assert f"needs {slices} slices of {size} members" in exact.message
    _, quick = plan_for(snapshot, members, spec=spec, levels=LEVELS, use_solver=False)
    assert not quick.admitted or fits
    for plan in (exact, quick):
        if plan.admitted:
            assert_slices(plan, rack_of, size)


@pytest.mark.parametrize("use_solver", [True, False], ids=["cpsat", "greedy"])
def test_two_short_slices_in_one_rack_are_both_completed(use_solver: bool) -> None:
    # Slices 0 and 1 have one bound member each in rA (2 + 2 = a whole multiple of 2 by
    # count alone): the two members arriving must go to rA, one to each, not to rB.
    snapshot, rack_of = racks({"b1": {"rA": [4], "rB": [8]}})
    spec = gang(min_member=4, slice_size=2, slice_key=RACK)
    bound = [("rA", 0), ("rA", 1)]
    problem = problem_for(snapshot, gpu_members(2), spec=spec, levels=LEVELS, slice_bound=bound)
    assert list(problem.slice_short) == [2, 0]
    plan = solve(problem, time_limit_s=10.0, use_solver=use_solver)
    assert plan.admitted, plan.message
    assert {rack_of[n] for _, n in plan.placements} == {"rA"}
    assert sorted(k for _, k in plan.slices) == [0, 1]
    # Two members in rB would be whole slices by count, and are refused.
    index = {name: n for n, name in enumerate(problem.node_names)}
    counts = np.zeros((problem.num_classes, problem.num_nodes), dtype=np.int64)
    counts[0, index["rB-n0"]] = 2
    assert f"{RACK}=rA: 0 members, its bound slices short of 2" in violations(problem, counts)
    # With room for one member in rA only, nothing is placed and the message says why.
    tight, _ = racks({"b1": {"rA": [2], "rB": [8]}})
    problem = problem_for(tight, gpu_members(2), spec=spec, levels=LEVELS, slice_bound=bound)
    plan = solve(problem, time_limit_s=10.0, use_solver=use_solver)
    assert not plan.admitted
    assert f"its bound slices need 2 more members in {RACK}=rA, which has room for 1" in (
        plan.message
    ), plan.message


@pytest.mark.parametrize("seed", range(6))
def test_cpsat_matches_the_naive_model_on_slices(seed: int) -> None:
    """The count model's slices (a whole number per rack, bound slices completed first)
    reach the optimum of the member-by-node model written with its own slice rule."""
    rng = np.random.default_rng(50 + seed)
    size = int(rng.choice([2, 3]))
    layout = {
        f"b{b}": {f"r{b}{r}": [int(g) for g in rng.choice([2, 4, 6], size=2)] for r in range(2)}
        for b in range(2)
    }
    snapshot, _ = racks(layout)
    slices = int(max(1, min(whole_slices(layout, 2, size) - int(rng.integers(0, 2)), 8 // size)))
    preferred = BLOCK if seed % 2 else None
    spec = gang(min_member=slices * size, slice_size=size, slice_key=RACK, preferred=preferred)
    members = gpu_members(slices * size)
    merged = problem_for(snapshot, members, spec=spec, levels=LEVELS)
    plan = solve(merged, time_limit_s=30.0, workers=1)
    assert plan.status is SolveStatus.OPTIMAL, plan.message
    assert violations(merged, counts_of(merged, plan)) == []
    unmerged = problem_for(snapshot, members, spec=spec, levels=LEVELS, merge=False)
    naive = solve_naive(unmerged, time_limit_s=30.0, workers=1)
    assert naive.objective == plan.objective
    assert naive.counts is not None
    assert violations(unmerged, naive.counts) == []

"""Gangs placed in the network: required and preferred levels, wider-level compactness,
tightest fit, in greedy and in CP-SAT (checked against the naive boolean model and a
brute force over domains written here from the node figures alone)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from lattice_dev.solver.naive import solve_naive
from scheduler.core.snapshot import Snapshot
from scheduler.model.gang import GangSpec
from scheduler.model.pod import Pod
from scheduler.solver import SolveStatus, solve, violations
from scheduler.solver.check import kept_whole, spans, tight_used
from scheduler.solver.domains import domain_rank, fewest, tightest
from scheduler.solver.problem import build_problem, compact_keys
from tests.builders import cluster
from tests.solver.support import (
    built,
    counts_of,
    framework,
    gang,
    gpu_node,
    member,
    plan_for,
    problem_for,
)

BLOCK, RACK, HOST = "example.com/block", "example.com/rack", "kubernetes.io/hostname"
LEVELS = (BLOCK, RACK, HOST)


def racks(layout: Mapping[str, Mapping[str, Sequence[int]]]) -> tuple[Snapshot, dict[str, str]]:
    """``{block: {rack: [GPUs per node]}}`` -> the snapshot and each node's rack."""
    nodes, rack_of = [], {}
    for block, rs in layout.items():
        for rack, gpus in rs.items():
            for i, g in enumerate(gpus):
                name = f"{rack}-n{i}"
                rack_of[name] = rack
                nodes.append(gpu_node(name, g).label(BLOCK, block).label(RACK, rack))
    return cluster(nodes), rack_of


def gpu_members(n: int, gpus: int = 2) -> list[Pod]:
    return built([member(f"m{i}", gpus) for i in range(n)])


def fewest_racks(layout: Mapping[str, Mapping[str, Sequence[int]]], n: int, gpus: int) -> int:
    """Brute force from the layout alone: the fewest racks whose nodes hold ``n`` members."""
    caps = [sum(g // gpus for g in ns) for rs in layout.values() for ns in rs.values()]
    for k in range(1, len(caps) + 1):
        if any(sum(c) >= n for c in itertools.combinations(caps, k)):
            return k
    raise AssertionError("does not fit")


def naive_objective(snapshot: Snapshot, members: Sequence[Pod], spec: GangSpec) -> int | None:
    """The naive member-by-node model's optimum for the gang (every member its own class),
    with the levels: what CP-SAT's count model must reach."""
    unmerged = problem_for(snapshot, members, spec=spec, levels=LEVELS, merge=False)
    return solve_naive(unmerged, time_limit_s=30.0, workers=1).objective


def test_compact_chain_from_levels() -> None:
    assert compact_keys(LEVELS, None, RACK) == (BLOCK, RACK)
    assert compact_keys(LEVELS, None, HOST) == LEVELS
    assert compact_keys(LEVELS, BLOCK, HOST) == (RACK, HOST)
    assert compact_keys(LEVELS, RACK, BLOCK) == ()  # one rack is one block
    assert compact_keys(LEVELS, RACK, RACK) == ()
    assert compact_keys((), None, "zone") == ("zone",)  # a key that is no level
    assert compact_keys(LEVELS, None, None) == ()


def test_fewest_and_tightest_domains() -> None:
    caps = {0: 3, 1: 3, 2: 2, 3: 1}  # Kueue's BestFit example: 7 pods -> 3 + 3 + 1
    assert fewest(caps, 7) == 3
    assert sorted(caps[d] for d in tightest(caps, 7)) == [1, 3, 3]
    # Equally few: the smallest domains that still hold the gang, the big ones stay whole.
    assert sorted(tightest({0: 5, 1: 5, 2: 4, 3: 4}, 8)) == [2, 3]
    assert fewest({0: 2, 1: 2}, 5) is None
    assert tightest({0: 2, 1: 3}, 6) == [1, 0]  # nothing holds it: largest first


LAYOUT_ONE = {"b1": {"rA": [8, 8], "rB": [4, 4]}, "b2": {"rC": [4]}}


@pytest.mark.parametrize("use_solver", [True, False], ids=["cpsat", "greedy"])
def test_preferred_one_rack_the_tightest_that_fits(use_solver: bool) -> None:
    # 4 members x 2 GPUs = 8 GPUs: rack A (16 free) or rack B (8 free) holds it whole;
    # rack B, exactly full afterwards, keeps rack A whole for a 16-GPU gang.
    snapshot, rack_of = racks(LAYOUT_ONE)
    members = gpu_members(4)
    problem, plan = plan_for(
        snapshot,
        members,
        spec=gang(min_member=4, preferred=RACK),
        levels=LEVELS,
        use_solver=use_solver,
    )
    assert plan.admitted
    assert {rack_of[n] for _, n in plan.placements} == {"rB"}
    assert fewest_racks(LAYOUT_ONE, 4, 2) == 1
    assert spans(problem, counts_of(problem, plan)) == (1, 1)
    assert f"over 1 {RACK} domain ({RACK}=rB) in 1 {BLOCK}" in plan.message


# Racks hold (2 GPUs a member): r11 2, r12 3 (block b1); r21 2, r22 1 (block b2). Four
# members need two racks; the tightest pairs (r11+r21, r12+r22) cross blocks, the only
# pair inside one block is r11+r12: compactness at the wider level comes first.
LAYOUT_TWO = {"b1": {"r11": [4], "r12": [6]}, "b2": {"r21": [4], "r22": [2]}}


@pytest.mark.parametrize("use_solver", [True, False], ids=["cpsat", "greedy"])
def test_preferred_two_racks_of_one_block(use_solver: bool) -> None:
    snapshot, rack_of = racks(LAYOUT_TWO)
    members = gpu_members(4)
    problem, plan = plan_for(
        snapshot,
        members,
        spec=gang(min_member=4, preferred=RACK),
        levels=LEVELS,
        use_solver=use_solver,
    )
    assert plan.admitted
    assert fewest_racks(LAYOUT_TWO, 4, 2) == 2
    assert {rack_of[n] for _, n in plan.placements} == {"r11", "r12"}
    assert spans(problem, counts_of(problem, plan)) == (1, 2)  # (blocks, racks)
    # Without the levels there is no block to keep: the tightest pair of racks wins.
    _, loose = plan_for(
        snapshot, members, spec=gang(min_member=4, preferred=RACK), use_solver=use_solver
    )
    used = {rack_of[n] for _, n in loose.placements}
    assert len(used) == 2
    assert used != {"r11", "r12"}


def test_required_block_preferred_rack() -> None:
    # Block b1's racks hold 2 + 2 members, block b2 one rack of 4: required block, preferred
    # rack -> b2's one rack, although b1 is the fuller block.
    layout = {"b1": {"r11": [4], "r12": [4]}, "b2": {"r21": [8, 8]}}
    snapshot, rack_of = racks(layout)
    spec = gang(min_member=4, topology_key=BLOCK, preferred=RACK)
    problem, plan = plan_for(snapshot, gpu_members(4), spec=spec, levels=LEVELS)
    assert plan.admitted
    assert {rack_of[n] for _, n in plan.placements} == {"r21"}
    assert plan.domain == "b2"
    assert [level.key for level in problem.compact] == [RACK]


def test_required_only_takes_the_fullest_block_that_fits() -> None:
    # Either block holds the gang; b1 has exactly the room (tight), b2 has twice as much.
    layout = {"b1": {"r11": [4], "r12": [4]}, "b2": {"r21": [8], "r22": [8]}}
    snapshot, rack_of = racks(layout)
    spec = gang(min_member=4, topology_key=BLOCK)
    for use_solver in (True, False):
        _, plan = plan_for(snapshot, gpu_members(4), spec=spec, use_solver=use_solver)
        assert plan.domain == "b1"
        assert {rack_of[n][:2] for _, n in plan.placements} == {"r1"}


def test_required_that_fits_nowhere_binds_nothing_and_says_why() -> None:
    layout = {"b1": {"r11": [8], "r12": [8]}, "b2": {"r21": [8]}}
    snapshot, _ = racks(layout)
    spec = gang(min_member=5, topology_key=RACK)
    _, plan = plan_for(snapshot, gpu_members(5, gpus=4), spec=spec, levels=LEVELS)
    assert plan.status is SolveStatus.INFEASIBLE
    assert plan.placements == ()
    assert f"no domain of {RACK} holds 5 members together" in plan.message
    assert f"needs 20 GPUs in one {RACK}; the most free in one is 8" in plan.message


def test_no_preference_keeps_the_old_objective() -> None:
    snapshot, _ = racks(LAYOUT_TWO)
    problem = problem_for(snapshot, gpu_members(4), spec=gang(min_member=4), levels=LEVELS)
    assert problem.compact == ()
    assert problem.tight is None
    assert problem.weights.spans == ()
    assert problem.weights.tight == 0


@pytest.mark.parametrize("seed", range(6))
def test_cpsat_matches_the_naive_model_and_the_fewest_racks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    layout = {
        f"b{b}": {f"r{b}{r}": [int(g) for g in rng.choice([0, 2, 4, 8], size=2)] for r in range(3)}
        for b in range(2)
    }
    snapshot, rack_of = racks(layout)
    total = sum(g // 2 for rs in layout.values() for gs in rs.values() for g in gs)
    n = int(min(max(total - int(rng.integers(0, 3)), 1), 8))
    members = gpu_members(n)
    spec = gang(min_member=n, preferred=RACK)
    merged = problem_for(snapshot, members, spec=spec, levels=LEVELS)
    plan = solve(merged, time_limit_s=30.0, workers=1)
    assert plan.status is SolveStatus.OPTIMAL
    counts = counts_of(merged, plan)
    assert violations(merged, counts) == []
    assert spans(merged, counts)[-1] == fewest_racks(layout, n, 2)
    assert naive_objective(snapshot, members, spec) == plan.objective
    # Greedy never beats the optimum; placing as many, it spans at least as many racks.
    greedy_plan = solve(merged, use_solver=False)
    assert greedy_plan.objective is not None
    assert plan.objective is not None
    assert greedy_plan.objective <= plan.objective
    if greedy_plan.placed == plan.placed:
        assert spans(merged, counts_of(merged, greedy_plan)) >= spans(merged, counts)
    # The tight tier counts the ranks of exactly the racks the plan uses.
    used = {rack_of[node] for _, node in plan.placements}
    assert merged.tight is not None
    ranks = {
        merged.tight.names[d]: int(merged.tight_rank[d]) for d in range(len(merged.tight.names))
    }
    assert tight_used(merged, counts) == sum(ranks[r] for r in used)


def busy_racks(
    layout: Mapping[str, Mapping[str, Sequence[tuple[int, int]]]],
) -> tuple[Snapshot, dict[str, str]]:
    """``{block: {rack: [(GPUs, GPUs in use) per node]}}``: the in-use GPUs held by a pod."""
    nodes, pods = [], []
    rack_map: dict[str, str] = {}
    for block, rs in layout.items():
        for rack, shapes in rs.items():
            for i, (g, busy) in enumerate(shapes):
                name = f"{rack}-n{i}"
                rack_map[name] = rack
                nodes.append(gpu_node(name, g).label(BLOCK, block).label(RACK, rack))
                if busy:
                    pods.append((member(f"busy-{name}", busy, app="other"), name))
    return cluster(nodes, pods), rack_map


@pytest.mark.parametrize("use_solver", [True, False], ids=["cpsat", "greedy"])
def test_a_block_gang_takes_a_racks_crumbs_before_an_empty_rack(use_solver: bool) -> None:
    # One block: rA has 4 of 16 GPUs free, rB and rC are empty. A gang of 2 x 2 GPUs fits
    # in any of them; in rA's crumbs it keeps both empty racks whole.
    layout = {"b1": {"rA": [(8, 8), (8, 4)], "rB": [(8, 0), (8, 0)], "rC": [(8, 0), (8, 0)]}}
    snapshot, rack_of = busy_racks(layout)
    problem, plan = plan_for(
        snapshot,
        gpu_members(2),
        spec=gang(min_member=2, preferred=BLOCK),
        levels=LEVELS,
        use_solver=use_solver,
    )
    assert plan.admitted
    assert {rack_of[n] for _, n in plan.placements} == {"rA"}
    assert [e.level.key for e in problem.empty] == [RACK]
    assert sorted(problem.empty[0].level.names[d] for d in problem.empty[0].ids) == ["rB", "rC"]
    assert kept_whole(problem, counts_of(problem, plan)) == 2


def test_a_block_gang_bigger_than_the_crumbs_fills_one_empty_rack_whole() -> None:
    # rA has 4 GPUs free, rB and rC 16 each. 10 members x 2 GPUs = 20 GPUs: rA's 4 plus
    # all of rB keeps rC whole; rB and rC half each (or rA plus 16 spread) would break both.
    layout = {"b1": {"rA": [(8, 8), (8, 4)], "rB": [(8, 0), (8, 0)], "rC": [(8, 0), (8, 0)]}}
    snapshot, rack_of = busy_racks(layout)
    problem, plan = plan_for(
        snapshot, gpu_members(10), spec=gang(min_member=10, preferred=BLOCK), levels=LEVELS
    )
    assert plan.admitted
    used = sorted(rack_of[n] for _, n in plan.placements)
    assert used.count("rA") == 2
    assert {used.count("rB"), used.count("rC")} == {8, 0}
    assert kept_whole(problem, counts_of(problem, plan)) == 2
    spec = gang(min_member=10, preferred=BLOCK)
    assert naive_objective(snapshot, gpu_members(10), spec) == plan.objective


def test_a_rack_of_cpu_nodes_and_free_gpus_is_empty_a_busy_gpu_is_not() -> None:
    layout = {"b1": {"rA": [(8, 0), (0, 0)], "rB": [(8, 2), (8, 0)]}}
    snapshot, _ = busy_racks(layout)
    problem = problem_for(
        snapshot, gpu_members(2), spec=gang(min_member=2, preferred=BLOCK), levels=LEVELS
    )
    (empty,) = problem.empty
    assert [empty.level.names[d] for d in empty.ids] == ["rA"]
    assert int(empty.room[empty.ids[0]]) == 8
    # No GPUs asked: no such tier, nor a pack table.
    cpu = problem_for(
        snapshot,
        [member("c0"), member("c1")],
        spec=gang(min_member=2, preferred=BLOCK),
        levels=LEVELS,
    )
    assert cpu.empty == ()
    assert cpu.weights.whole_domains == 0


@pytest.mark.parametrize("seed", range(6))
def test_block_gangs_match_the_naive_model(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    layout = {
        f"b{b}": {
            f"r{b}{r}": [(8, int(rng.choice([0, 0, 2, 4, 8]))) for _ in range(2)] for r in range(3)
        }
        for b in range(2)
    }
    snapshot, _ = busy_racks(layout)
    free = sum(8 - busy for rs in layout.values() for ns in rs.values() for _, busy in ns)
    n = int(min(max(free // 2 - int(rng.integers(0, 6)), 1), 8))
    spec = gang(min_member=n, preferred=BLOCK)
    merged = problem_for(snapshot, gpu_members(n), spec=spec, levels=LEVELS)
    plan = solve(merged, time_limit_s=30.0, workers=1)
    assert plan.status is SolveStatus.OPTIMAL
    assert violations(merged, counts_of(merged, plan)) == []
    assert naive_objective(snapshot, gpu_members(n), spec) == plan.objective
    greedy_plan = solve(merged, use_solver=False)
    assert greedy_plan.objective is not None
    assert plan.objective is not None
    assert greedy_plan.objective <= plan.objective


def test_a_partial_gangs_rest_joins_its_bound_members_rack() -> None:
    # rA holds the 2 remaining members exactly (the tightest rack); rB, where a member is
    # bound already (2 of its first node's 8 GPUs), holds more. The rest in rB keeps the
    # gang in one rack.
    layout = {"b1": {"rA": [(4, 0)], "rB": [(8, 2), (8, 0)]}}
    snapshot, rack_of = busy_racks(layout)
    spec = gang(min_member=3, preferred=RACK)
    rest = gpu_members(2)
    alone = problem_for(snapshot, rest, spec=spec, levels=LEVELS)
    plan = solve(alone, time_limit_s=10.0)
    assert {rack_of[n] for _, n in plan.placements} == {"rA"}
    partial = build_problem(
        framework(),
        snapshot,
        spec,
        rest,
        need=2,
        levels=LEVELS,
        bound_nodes=["rB-n0"],
    )
    assert partial.spanned == ((0,), (1,))  # (blocks, racks): b1, rB
    # Greedy's fill order puts the bound member's rack first (alone, the tightest first).
    everywhere = np.arange(partial.num_nodes)
    order = domain_rank(partial, everywhere, 2)
    assert order is not None
    at = {name: int(order[i]) for i, name in enumerate(partial.node_names)}
    assert at["rB-n0"] < at["rA-n0"]
    loose = domain_rank(alone, np.arange(alone.num_nodes), 2)
    assert loose is not None
    at = {name: int(loose[i]) for i, name in enumerate(alone.node_names)}
    assert at["rA-n0"] < at["rB-n0"]
    greedy = solve(partial, use_solver=False)
    assert {rack_of[n] for _, n in greedy.placements} == {"rB"}
    plan = solve(partial, time_limit_s=10.0)
    assert plan.admitted
    assert {rack_of[n] for _, n in plan.placements} == {"rB"}
    counts = counts_of(partial, plan)
    assert spans(partial, counts) == (1, 1)
    assert f"over 1 {RACK} domain ({RACK}=rB)" in plan.message
    # rA instead would span both racks, counted from the bound member's rack too.
    other = np.zeros_like(counts)
    other[0, partial.node_names.index("rA-n0")] = 2
    assert spans(partial, other) == (1, 2)
    unmerged = build_problem(
        framework(),
        snapshot,
        spec,
        rest,
        need=2,
        levels=LEVELS,
        bound_nodes=["rB-n0"],
        merge=False,
    )
    assert solve_naive(unmerged, time_limit_s=30.0, workers=1).objective == plan.objective

"""What the solve reads: its own copy of the snapshot (not the live one), LoadAware's
preferences, interchangeable nodes dropped without changing the answer; the benchmark."""

from __future__ import annotations

import numpy as np
import pytest

from lattice_dev.solver.bench import main
from scheduler.core.load import LoadView
from scheduler.model.names import LABEL_HOSTNAME
from scheduler.predict import LoadPredictor, PredictConfig
from scheduler.solver import SolveStatus, greedy, solve
from scheduler.solver.model import ModelStatus, distinct_nodes, solve_counts
from tests.builders import cluster, make_node, make_pod
from tests.solver.support import assert_valid, built, gpu_node, member, problem_for

NOW = 1000.0
GIB = 1024**3


def test_solve_reads_only_the_problem_not_the_live_snapshot() -> None:
    snapshot = cluster([gpu_node(f"n{i}", 4, cpu=str(8 + i)) for i in range(4)])
    members = built([member(f"m{i}", 2) for i in range(4)])
    problem = problem_for(snapshot, members)
    before = solve(problem)
    for i in range(4):  # the event loop moves on while the worker thread solves
        snapshot.add_pod(make_pod(f"late-{i}", resources={"nvidia.com/gpu": "4"}).build(), f"n{i}")
    snapshot.remove_node("n0")
    after = solve(problem)
    assert after.status is before.status is SolveStatus.OPTIMAL
    assert after.placements == before.placements


def test_nodes_loadaware_passes_over_are_used_last() -> None:
    predictor = LoadPredictor(PredictConfig())
    capacity_cpu, capacity_mem = 64_000, 256 * GIB
    outcome = predictor.observe(
        "hot", NOW - 5.0, 0.95 * capacity_cpu, 0.2 * capacity_mem, capacity_cpu, capacity_mem
    )
    assert outcome.name == "ACCEPTED"
    snapshot = cluster([make_node("hot", cpu="64", memory="256Gi"), make_node("a"), make_node("b")])
    members = built([member(f"m{i}", cpu="2") for i in range(5)])
    problem = problem_for(snapshot, members, load=LoadView(predictor, NOW))
    hot = problem.node_names.index("hot")
    assert not problem.preferred[0, hot]
    plan = solve(problem, time_limit_s=10.0)
    assert_valid(snapshot, members, problem, plan)
    placed = [node for _, node in plan.placements]
    # The roomy node would score best, but a and b take what they can first.
    assert sorted(placed) == ["a", "a", "b", "b", "hot"]


@pytest.mark.parametrize("anti", [False, True])
def test_dropping_interchangeable_nodes_keeps_the_optimum(anti: bool) -> None:
    nodes = [gpu_node(f"e{i}", 8).label("zone", "a" if i % 2 else "b") for i in range(12)]
    nodes += [gpu_node(f"p{i}", 8).label("zone", "a") for i in range(6)]
    busy = [(make_pod(f"busy-{i}", resources={"nvidia.com/gpu": "5"}), f"p{i}") for i in range(6)]
    snapshot = cluster(nodes, busy)
    pods = [member(f"m{i}", 1 + i % 2).spread(2, "zone", {"app": "train"}) for i in range(5)]
    if anti:
        pods = [p.pod_anti_affinity(LABEL_HOSTNAME, {"app": "train"}) for p in pods]
    problem = problem_for(snapshot, built(pods))
    everything = np.arange(problem.num_nodes)
    hint = greedy(problem).counts
    kept = distinct_nodes(problem, everything, np.flatnonzero(hint.any(axis=0)))
    assert len(kept) < problem.num_nodes
    full = solve_counts(problem, everything, hint, time_limit_s=30.0, reduce=False)
    reduced = solve_counts(problem, everything, hint, time_limit_s=30.0)
    assert full.status is reduced.status is ModelStatus.OPTIMAL
    assert reduced.objective == full.objective
    assert reduced.variables < full.variables


def test_bench_prints_a_row_per_case(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--nodes", "40", "--members", "8", "--time-limit", "0.2", "--naive"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["case", "nodes", "memb"]
    cases = ("8 x 8 GPU ", "8 x 1 GPU ", "8 x 1 GPU, one rack", "mixed ")
    for case in cases:
        assert sum(line.startswith(case) for line in lines) == 1, case
    assert sum(line.startswith("naive 8 x") for line in lines) == 2

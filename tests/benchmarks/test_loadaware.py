"""The load-aware benchmark's pure measures: hot placements, p95, step lag, leader churn."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from lattice_dev.benchmarks.loadaware import (
    Fleet,
    Phase,
    PhaseResult,
    Placement,
    alpha_rows,
    alpha_table,
    classify,
    design_fleet,
    leader_churn,
    p95,
    phase_table,
    ratio_lines,
    reports_to_follow,
    steady_series,
    step_hotspots,
    step_lag,
)
from lattice_dev.predict.synthetic import GIB, SyntheticLoad, SyntheticNode
from scheduler.predict import LoadReport

FREE = (4000, 16 * GIB)
POD = (200, 256 * 2**20)


@pytest.mark.parametrize(
    ("node", "fractions", "free", "expected"),
    [
        pytest.param("a", {"a": 0.5, "b": 0.3}, {"a": FREE, "b": FREE}, (False, False), id="cool"),
        pytest.param("a", {"a": 0.8, "b": 0.3}, {"a": FREE, "b": FREE}, (False, False), id="at-80"),
        pytest.param(
            "a", {"a": 0.9, "b": 0.3}, {"a": FREE, "b": FREE}, (True, True), id="avoidable"
        ),
        pytest.param(
            "a", {"a": 0.9, "b": 0.8}, {"a": FREE, "b": FREE}, (True, True), id="80-is-cool"
        ),
        pytest.param(
            "a", {"a": 0.9, "b": 0.95}, {"a": FREE, "b": FREE}, (True, False), id="all-hot"
        ),
        pytest.param(
            "a", {"a": 0.9, "b": 0.3}, {"a": FREE, "b": (100, 16 * GIB)}, (True, False), id="no-cpu"
        ),
        pytest.param(
            "a", {"a": 0.9, "b": 0.3}, {"a": FREE, "b": (4000, 2**20)}, (True, False), id="no-mem"
        ),
        pytest.param("a", {"a": 0.9, "b": 0.3}, {"a": FREE}, (True, False), id="unknown-free"),
        pytest.param("z", {"a": 0.9}, {"a": FREE}, (False, False), id="unknown-node"),
    ],
)
def test_classify(
    node: str,
    fractions: dict[str, float],
    free: dict[str, tuple[int, int]],
    expected: tuple[bool, bool],
) -> None:
    assert classify(node, fractions, free, POD) == expected


@pytest.mark.parametrize(
    ("alpha", "reports"), [(1.0, 1), (0.9, 1), (0.8, 2), (0.5, 4), (0.4, 5), (0.3, 7), (0.1, 22)]
)
def test_reports_to_follow(alpha: float, reports: int) -> None:
    assert reports_to_follow(alpha) == reports


def test_p95() -> None:
    assert p95([float(x) for x in range(21)]) == pytest.approx(19.0)
    assert p95([0.5]) == 0.5
    assert math.isnan(p95([]))


def series(values: list[float], *, start: float = 0.0, interval: float = 5.0) -> list[LoadReport]:
    return [
        LoadReport(
            node="n",
            sample_time=start + k * interval,
            cpu_used_milli=v,
            mem_used_bytes=GIB,
            cpu_capacity_milli=4000,
            mem_capacity_bytes=16 * GIB,
        )
        for k, v in enumerate(values)
    ]


STEP = series([1000.0] * 10 + [3000.0] * 11)  # reports at 0..100 s, the step at 50 s


@pytest.mark.parametrize(
    ("alpha", "step_time", "lag"),
    [
        pytest.param(1.0, 50.0, 0.0, id="alpha-1-first-report"),
        pytest.param(1.0, 48.0, 2.0, id="waits-for-the-next-report"),
        pytest.param(0.5, 50.0, 15.0, id="alpha-0.5-four-reports"),  # 1 - 0.5^4 >= 0.9
        pytest.param(0.3, 50.0, 30.0, id="alpha-0.3-seven-reports"),  # 1 - 0.7^7 >= 0.9
        pytest.param(0.1, 50.0, None, id="alpha-0.1-not-within-the-series"),
    ],
)
def test_step_lag(alpha: float, step_time: float, lag: float | None) -> None:
    assert step_lag(STEP, step_time=step_time, alpha=alpha, interval_s=5.0) == lag


def test_step_lag_needs_an_increase_on_both_sides() -> None:
    assert step_lag(STEP, step_time=0.0, alpha=0.5, interval_s=5.0) is None
    assert step_lag(STEP, step_time=200.0, alpha=0.5, interval_s=5.0) is None
    down = series([3000.0] * 10 + [1000.0] * 10)
    assert step_lag(down, step_time=50.0, alpha=0.5, interval_s=5.0) is None


def test_step_lag_is_measured_from_the_level_before_the_step() -> None:
    # Noise before the step: the target is the level then plus 90 % of the gap to the plateau.
    noisy = series([900.0, 1100.0] * 5 + [3000.0] * 10)
    assert step_lag(noisy, step_time=50.0, alpha=0.5, interval_s=5.0) == 15.0
    # Load rising into the step (pods warming up): the level lags, the lag stays the theory's.
    rising = series([1000.0] * 7 + [1300.0, 1600.0, 1900.0] + [3000.0] * 10)
    assert step_lag(rising, step_time=50.0, alpha=0.5, interval_s=5.0) == 15.0
    assert step_lag(rising, step_time=50.0, alpha=0.3, interval_s=5.0) == 30.0


def test_step_lag_of_a_level_still_above_the_plateau_is_undefined() -> None:
    # A replay that starts on an earlier, higher plateau: the level is not settled.
    unsettled = series([4000.0] * 5 + [1000.0] * 2 + [3000.0] * 10)
    assert step_lag(unsettled, step_time=35.0, alpha=0.1, interval_s=5.0) is None


def test_leader_churn_counts_noise_driven_leader_changes() -> None:
    rounds = 60
    wobbly = series([900.0 if k % 2 else 1200.0 for k in range(rounds)])  # mean 1050
    steady = [dataclasses.replace(r, node="m", cpu_used_milli=1100.0) for r in wobbly]
    both = {"n": wobbly, "m": steady}
    assert leader_churn(both, alpha=1.0, interval_s=5.0, warmup_rounds=20) == 1.0
    assert leader_churn(both, alpha=0.1, interval_s=5.0, warmup_rounds=20) == 0.0
    with pytest.raises(ValueError, match="two rounds"):
        leader_churn(both, alpha=0.1, interval_s=5.0, warmup_rounds=59)


def test_leader_churn_falls_with_alpha_on_the_simulators_noise() -> None:
    nodes = [SyntheticNode(name=f"n{i}", base_cpu=0.3 + 0.002 * i) for i in range(10)]
    load = SyntheticLoad(nodes, seed=3)
    steady = steady_series(load, [n.name for n in nodes], start=1e9, rounds=240, interval_s=5.0)
    churn = [leader_churn(steady, alpha=a, interval_s=5.0) for a in (0.1, 0.3, 0.8)]
    assert churn == sorted(churn)
    assert churn[0] < churn[-1]


def test_design_fleet_is_reproducible_and_skewed() -> None:
    names = [f"kwok-node-{i:04d}" for i in range(60)]
    fleet = design_fleet(names, seed=7, cpu_capacity_milli=4000, mem_capacity_bytes=16 * GIB)
    again = design_fleet(names[::-1], seed=7, cpu_capacity_milli=4000, mem_capacity_bytes=16 * GIB)
    assert fleet == again
    assert len(fleet.hot) == 12
    assert len(fleet.steps) == 3
    assert not set(fleet.steps) & fleet.hot
    for node in fleet.nodes:
        lo, hi = (0.85, 0.95) if node.name in fleet.hot else (0.1, 0.5)
        assert lo <= node.base_cpu <= hi
        assert node.noise_cpu == 0.02


def test_step_hotspots_lift_stepped_nodes_to_the_target() -> None:
    nodes = (
        SyntheticNode(name="a", base_cpu=0.3, noise_cpu=0.0),
        SyntheticNode(name="b", base_cpu=0.9, noise_cpu=0.0),
    )
    fleet = Fleet(nodes=nodes, hot=frozenset({"b"}), steps=("a",))
    load = SyntheticLoad(nodes, seed=1, hotspots=step_hotspots(fleet, 100.0))
    assert load.sample("a", 99.0).cpu_used_milli == pytest.approx(1200.0)
    assert load.sample("a", 100.0).cpu_used_milli == pytest.approx(0.92 * 4000)
    assert load.sample("a", 5000.0).cpu_used_milli == pytest.approx(0.92 * 4000)
    assert load.sample("b", 100.0).cpu_used_milli == pytest.approx(0.9 * 4000)


def _result(phase: Phase, hot: int, avoidable: int, cpu: list[float]) -> PhaseResult:
    placements = [
        Placement(
            pod=f"p{i}",
            node="a",
            at=float(i),
            cpu=0.9,
            hot=i < hot,
            avoidable=i < avoidable,
            after_step=i == 0,
        )
        for i in range(10)
    ]
    return PhaseResult(
        phase=phase,
        placements=placements,
        unbound=0,
        cpu_after={f"n{i}": c for i, c in enumerate(cpu)},
        stream_start=0.0,
        step_time=50.0,
        end_time=100.0,
        step_series={"a": tuple(STEP)},
    )


def test_tables_and_ratios() -> None:
    kube = _result(Phase("kube-scheduler", "kube-scheduler"), 4, 3, [0.2, 0.5, 1.0])
    default = _result(Phase("lattice (default α=0.4)", "lattice"), 0, 0, [0.2, 0.5, 0.9])
    low = _result(Phase("lattice α=0.1", "lattice", 0.1), 1, 0, [0.2, 0.5, 0.9])
    results = [kube, default, low]
    assert (kube.hot, kube.avoidable, kube.after_step, kube.hot_nodes_after) == (4, 3, 1, 1)
    assert kube.max_cpu == 1.0
    assert kube.p95_cpu == pytest.approx(float(np.percentile([0.2, 0.5, 1.0], 95)))

    lines = phase_table(results)
    assert lines[0].split()[:4] == ["phase", "pods", "hot", "avoidable"]
    assert "kube-scheduler" in lines[1]

    steady = {"n": series([1000.0] * 50), "m": series([1100.0] * 50)}
    rows = alpha_rows(results, [0.1, 0.5], default_alpha=0.4, interval_s=5.0, steady=steady)
    assert [r.label for r in rows] == ["0.1", "0.4 (default)", "0.5"]
    assert [(r.hot, r.avoidable, r.after_step) for r in rows] == [(1, 0, 1), (0, 0, 0), (None,) * 3]
    # α 0.1 needs 22 reports; the step was held for 11 (50 s): a lower bound only.
    assert rows[0].lags == ()
    assert rows[0].held == (50.0, 50.0, 50.0)
    assert math.isinf(rows[0].lag_median)
    assert rows[2].lags == (15.0, 15.0, 15.0)
    assert all(r.churn == 0.0 for r in rows)
    table = alpha_table(rows, 5.0)
    assert table[1].split()[:3] == ["0.1", ">50", "0/3"]
    assert "22 reports (105-110 s)" in table[1]
    assert table[3].split()[:3] == ["0.5", "15", "3/3"]

    ratios = ratio_lines(results)
    assert len(ratios) == 2
    assert "hot placements 0 vs 4 (avoidable 0 vs 3)" in ratios[0]

"""Scores: bounds, monotonicity, target-packing shape, threshold mask."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.predict import (
    LoadStatus,
    PodEstimate,
    least_loaded_scores,
    target_packing_scores,
    threshold_verdict,
)
from scheduler.predict.scoring import target_packing

from .builders import make_batch

NO_POD = PodEstimate(cpu_milli=0.0, memory_bytes=0.0)


@pytest.mark.parametrize(
    ("cpu", "mem", "expected"),
    [
        pytest.param(0.0, 0.0, 100, id="idle"),
        pytest.param(1000.0, 1000.0, 0, id="full"),
        pytest.param(5000.0, 5000.0, 0, id="overcommitted"),
        pytest.param(250.0, 750.0, 50, id="half-on-average"),
        pytest.param(200.0, 0.0, 90, id="cpu-only-load"),
    ],
)
def test_least_loaded_values(cpu: float, mem: float, expected: int) -> None:
    scores = least_loaded_scores(make_batch([cpu], [mem]), NO_POD)
    assert scores.dtype == np.int64
    assert scores.tolist() == [expected]


def test_least_loaded_counts_the_incoming_pod() -> None:
    batch = make_batch([100.0, 100.0], [0.0, 0.0], cpu_cap=1000.0)
    pod = PodEstimate(cpu_milli=400.0, memory_bytes=0.0)
    assert least_loaded_scores(batch, pod, cpu_weight=1, memory_weight=0).tolist() == [50, 50]


def test_least_loaded_weights() -> None:
    batch = make_batch([0.0], [1000.0])
    assert least_loaded_scores(batch, NO_POD, cpu_weight=3, memory_weight=1).tolist() == [75]
    with pytest.raises(ValueError, match="weights"):
        least_loaded_scores(batch, NO_POD, cpu_weight=0, memory_weight=0)


def test_zero_capacity_scores_as_full() -> None:
    batch = make_batch([0.0], [0.0], cpu_cap=0.0)
    assert least_loaded_scores(batch, NO_POD, cpu_weight=1, memory_weight=0).tolist() == [0]


loads = st.lists(st.floats(0.0, 3000.0), min_size=1, max_size=30)


@settings(deadline=None)
@given(cpu=loads, mem=st.floats(0.0, 3000.0), cw=st.integers(0, 5), mw=st.integers(1, 5))
def test_least_loaded_is_bounded_and_non_increasing_in_load(
    cpu: list[float], mem: float, cw: int, mw: int
) -> None:
    ordered = sorted(cpu)
    scores = least_loaded_scores(
        make_batch(ordered, [mem] * len(ordered)), NO_POD, cpu_weight=cw, memory_weight=mw
    )
    assert ((scores >= 0) & (scores <= 100)).all()
    assert (np.diff(scores) <= 0).all()


@pytest.mark.parametrize(
    ("cpu", "expected"),
    [
        pytest.param(0.0, 40, id="idle-scores-target"),
        pytest.param(200.0, 70, id="halfway-to-target"),
        pytest.param(400.0, 100, id="at-target"),
        pytest.param(401.0, 40, id="just-over-target-drops"),
        pytest.param(700.0, 20, id="falling"),
        pytest.param(1000.0, 0, id="full"),
        pytest.param(1500.0, 0, id="overcommitted"),
    ],
)
def test_target_packing_shape(cpu: float, expected: int) -> None:
    scores = target_packing_scores(make_batch([cpu]), NO_POD, cpu_target=0.4)
    assert scores.dtype == np.int64
    assert scores.tolist() == [expected]


@settings(deadline=None)
@given(us=st.lists(st.floats(0.0, 2.0), min_size=2, max_size=30), target=st.floats(0.05, 0.95))
def test_target_packing_rises_to_target_then_falls(us: list[float], target: float) -> None:
    u = np.array(sorted(us))
    curve = target_packing(u, target)
    assert ((curve >= 0.0) & (curve <= 1.0 + 1e-12)).all()
    below, above = curve[u <= target], curve[u > target]
    assert (np.diff(below) >= -1e-12).all()
    assert (np.diff(above) <= 1e-12).all()
    if below.size and above.size:
        assert above.max() <= below.max() + 1e-12


def test_target_packing_rejects_bad_target() -> None:
    with pytest.raises(ValueError, match="target"):
        target_packing(np.zeros(1), 1.0)


def test_threshold_mask_is_off_by_default() -> None:
    verdict = threshold_verdict(make_batch([2000.0], [2000.0], cpu_pressure=[99.0]), NO_POD)
    assert not verdict.rejected.any()


def test_threshold_mask_counts_the_pod_per_resource() -> None:
    batch = make_batch([700.0, 850.0, 100.0], [100.0, 100.0, 950.0])
    pod = PodEstimate(cpu_milli=100.0, memory_bytes=100.0)
    verdict = threshold_verdict(batch, pod, cpu_threshold=0.8, memory_threshold=0.9)
    assert verdict.cpu.tolist() == [False, True, False]
    assert verdict.memory.tolist() == [False, False, True]
    assert verdict.rejected.tolist() == [False, True, True]


def test_pressure_threshold_ignores_nodes_without_pressure() -> None:
    batch = make_batch(
        [0.0] * 3,
        cpu_pressure=[5.0, 50.0, float("nan")],
        memory_pressure=[30.0, 0.0, float("nan")],
        status=[LoadStatus.FRESH, LoadStatus.FRESH, LoadStatus.STALE],
    )
    verdict = threshold_verdict(
        batch, NO_POD, cpu_pressure_threshold=20.0, memory_pressure_threshold=20.0
    )
    assert verdict.cpu_pressure.tolist() == [False, True, False]
    assert verdict.memory_pressure.tolist() == [True, False, False]

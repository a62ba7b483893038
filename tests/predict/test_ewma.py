"""The EWMA on synthetic series: step, ramp, spike, irregular intervals, bounds."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.predict.ewma import Series, effective_weight, update

from .builders import INTERVAL, make_predictor, predict_one, report


def _run(values: list[float], *, alpha: float, beta: float = 0.0, dt: float = INTERVAL) -> Series:
    series = Series(values[0])
    for value in values[1:]:
        series, _ = update(series, value, dt=dt, alpha=alpha, beta=beta, interval=INTERVAL)
    return series


def test_effective_weight_scales_with_elapsed_intervals() -> None:
    assert effective_weight(0.3, INTERVAL, INTERVAL) == pytest.approx(0.3)
    assert effective_weight(0.3, 2 * INTERVAL, INTERVAL) == pytest.approx(1 - 0.7**2)
    assert effective_weight(0.3, INTERVAL / 2, INTERVAL) == pytest.approx(1 - 0.7**0.5)
    assert effective_weight(1.0, 1.0, INTERVAL) == 1.0
    assert effective_weight(0.3, 0.0, INTERVAL) == 0.0


@pytest.mark.parametrize(
    ("alpha", "reports_to_90pct"),
    [
        pytest.param(1.0, 1, id="alpha-1.0"),
        pytest.param(0.9, 1, id="alpha-0.9"),
        pytest.param(0.5, 4, id="alpha-0.5"),
        pytest.param(0.4, 5, id="alpha-0.4"),
        pytest.param(0.3, 7, id="alpha-0.3"),
        pytest.param(0.1, 22, id="alpha-0.1"),
    ],
)
def test_step_lag_to_90_percent(alpha: float, reports_to_90pct: int) -> None:
    # ceil(ln 0.1 / ln(1 - alpha)) reports after the step, through the predictor itself.
    predictor = make_predictor(cpu_alpha=alpha, settle_delay_s=0.0)
    report(predictor, "n", 0.0, cpu=0.0)
    count = 0
    t = 0.0
    while True:
        t += INTERVAL
        count += 1
        report(predictor, "n", t, cpu=1000.0)
        if predict_one(predictor, "n", t).cpu_used_milli[0] >= 900.0 - 1e-9:
            break
    assert count == reports_to_90pct
    if alpha < 1.0:
        assert count == math.ceil(math.log(0.1) / math.log(1 - alpha) - 1e-9)


@pytest.mark.parametrize("alpha", [0.2, 0.5, 0.8])
def test_ramp_lags_by_slope_times_interval_times_one_minus_alpha_over_alpha(alpha: float) -> None:
    slope_per_report = 10.0
    values = [slope_per_report * i for i in range(200)]
    series = _run(values, alpha=alpha)
    assert values[-1] - series.level == pytest.approx(slope_per_report * (1 - alpha) / alpha)


def test_holt_trend_removes_ramp_lag_and_projects_ahead() -> None:
    values = [10.0 * i for i in range(200)]
    series = _run(values, alpha=0.5, beta=0.3)
    assert series.level == pytest.approx(values[-1], abs=1e-6)
    assert series.trend == pytest.approx(10.0 / INTERVAL)
    assert series.forecast(INTERVAL) == pytest.approx(values[-1] + 10.0)


def test_spike_is_damped_and_decays() -> None:
    alpha = 0.3
    series = _run([100.0] * 5 + [1100.0], alpha=alpha)
    assert series.level == pytest.approx(100.0 + alpha * 1000.0)
    for k in range(1, 4):
        series, _ = update(series, 100.0, dt=INTERVAL, alpha=alpha, beta=0.0, interval=INTERVAL)
        assert series.level == pytest.approx(100.0 + alpha * (1 - alpha) ** k * 1000.0)


def test_missing_report_weighs_like_the_reports_it_replaces() -> None:
    one_late = _run([0.0, 500.0], alpha=0.4, dt=2 * INTERVAL)
    two_on_time = _run([0.0, 500.0, 500.0], alpha=0.4)
    assert one_late.level == pytest.approx(two_on_time.level)


def test_irregular_reports_through_predictor_match_regular_ones() -> None:
    regular = make_predictor(cpu_alpha=0.4)
    irregular = make_predictor(cpu_alpha=0.4)
    for t in (0.0, 15.0, 30.0, 45.0, 60.0):
        report(regular, "n", t, cpu=0.0 if t == 0 else 800.0)
    for t in (0.0, 20.0, 25.0, 60.0):  # jittered and one missing
        report(irregular, "n", t, cpu=0.0 if t == 0 else 800.0)
    a = predict_one(regular, "n", 60.0).cpu_used_milli[0]
    b = predict_one(irregular, "n", 60.0).cpu_used_milli[0]
    assert a == pytest.approx(b)


samples = st.lists(
    st.tuples(
        st.floats(min_value=0.01, max_value=600.0),  # gap since previous sample
        st.floats(min_value=0.0, max_value=1e12),
    ),
    min_size=1,
    max_size=40,
)


@settings(deadline=None)
@given(first=st.floats(min_value=0.0, max_value=1e12), rest=samples, alpha=st.floats(0.01, 1.0))
def test_level_stays_within_min_and_max_of_inputs(
    first: float, rest: list[tuple[float, float]], alpha: float
) -> None:
    series = Series(first)
    seen = [first]
    for dt, value in rest:
        series, weight = update(series, value, dt=dt, alpha=alpha, beta=0.0, interval=INTERVAL)
        seen.append(value)
        assert 0.0 <= weight <= 1.0
        tolerance = 1e-9 * max(seen)
        assert min(seen) - tolerance <= series.level <= max(seen) + tolerance


@settings(deadline=None)
@given(
    start=st.floats(0.0, 1e6),
    value=st.floats(0.0, 1e6),
    dt1=st.floats(0.01, 100.0),
    dt2=st.floats(0.01, 100.0),
    alpha=st.floats(0.01, 1.0),
)
def test_splitting_a_gap_does_not_change_the_level(
    start: float, value: float, dt1: float, dt2: float, alpha: float
) -> None:
    # Zero-order hold: a constant input over dt1 + dt2 is one step or two, the same.
    kw = {"alpha": alpha, "beta": 0.0, "interval": INTERVAL}
    once, _ = update(Series(start), value, dt=dt1 + dt2, **kw)
    half, _ = update(Series(start), value, dt=dt1, **kw)
    twice, _ = update(half, value, dt=dt2, **kw)
    assert twice.level == pytest.approx(once.level, rel=1e-9, abs=1e-6)

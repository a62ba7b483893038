"""LoadPredictor: report hygiene, in-flight estimates, staleness, batch and breakdown."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.predict import (
    CpuMem,
    LoadPredictor,
    LoadStatus,
    ObserveOutcome,
    PredictConfig,
    PsiSample,
    estimate_pod,
)

from .builders import CPU_CAP, MEM_CAP, make_predictor, predict_one, report

MIB = 1024 * 1024

# --- report hygiene -------------------------------------------------------


@pytest.mark.parametrize(
    ("t", "expected"),
    [
        pytest.param(30.0, ObserveOutcome.DUPLICATE, id="duplicate"),
        pytest.param(15.0, ObserveOutcome.OUT_OF_ORDER, id="out-of-order"),
        pytest.param(45.0, ObserveOutcome.ACCEPTED, id="newer"),
    ],
)
def test_old_and_duplicate_reports_are_ignored(t: float, expected: ObserveOutcome) -> None:
    predictor = make_predictor(cpu_alpha=0.5)
    report(predictor, "n", 0.0, cpu=0.0)
    report(predictor, "n", 30.0, cpu=1000.0)
    before = predict_one(predictor, "n", 45.0).cpu_used_milli[0]
    assert predictor.observe("n", t, 3000.0, 0.0, CPU_CAP, MEM_CAP) is expected
    after = predict_one(predictor, "n", 45.0).cpu_used_milli[0]
    assert bool(after == before) is (expected is not ObserveOutcome.ACCEPTED)


@pytest.mark.parametrize(
    ("cpu", "mem", "cpu_cap", "psi"),
    [
        pytest.param(-1.0, 0.0, CPU_CAP, None, id="negative-cpu"),
        pytest.param(0.0, math.nan, CPU_CAP, None, id="nan-memory"),
        pytest.param(0.0, 0.0, 0, None, id="zero-capacity"),
        pytest.param(0.0, 0.0, CPU_CAP, PsiSample(cpu_some=math.inf), id="inf-psi"),
        pytest.param(0.0, 0.0, CPU_CAP, PsiSample(memory_full=-1.0), id="negative-psi"),
    ],
)
def test_malformed_reports_are_rejected(
    cpu: float, mem: float, cpu_cap: int, psi: PsiSample | None
) -> None:
    predictor = make_predictor()
    outcome = predictor.observe("n", 0.0, cpu, mem, cpu_cap, MEM_CAP, psi=psi)
    assert outcome is ObserveOutcome.INVALID
    assert predictor.status("n", 0.0) is LoadStatus.UNKNOWN


def test_future_dated_report_is_rejected_so_honest_ones_still_land() -> None:
    predictor = make_predictor(max_future_skew_s=10.0)
    assert predictor.observe("n", 1000.0, 0.0, 0.0, CPU_CAP, MEM_CAP, now=0.0) is (
        ObserveOutcome.FROM_FUTURE
    )
    assert predictor.observe("n", 5.0, 0.0, 0.0, CPU_CAP, MEM_CAP, now=0.0) is (
        ObserveOutcome.ACCEPTED
    )


# --- in-flight estimates --------------------------------------------------


@pytest.mark.parametrize(
    ("cpu_req", "mem_req", "expected"),
    [
        pytest.param(500, 1024 * MIB, (750.0, 512.0 * MIB), id="scaled"),
        pytest.param(0, 1024 * MIB, (100.0, 512.0 * MIB), id="no-cpu-request"),
        pytest.param(500, 0, (750.0, 200.0 * MIB), id="no-memory-request"),
        pytest.param(0, 0, (100.0, 200.0 * MIB), id="best-effort"),
    ],
)
def test_pod_estimate_scales_requests_or_uses_defaults(
    cpu_req: int, mem_req: int, expected: tuple[float, float]
) -> None:
    config = PredictConfig(cpu_request_scale=1.5, memory_request_scale=0.5)
    estimate = estimate_pod(config, cpu_req, mem_req)
    assert (estimate.cpu_milli, estimate.memory_bytes) == expected


def test_negative_request_is_a_bug() -> None:
    with pytest.raises(ValueError, match="negative"):
        make_predictor().note_placement("n", "ns/p", -1, 0, now=0.0)


def _fresh_with_pod(**overrides: float) -> LoadPredictor:
    """Node n at 1000m; pod ns/p (500m, 1Gi) placed at t=10."""
    predictor = make_predictor(settle_delay_s=20.0, **overrides)
    report(predictor, "n", 0.0, cpu=1000.0, mem=1024 * MIB)
    predictor.note_placement("n", "ns/p", 500, 1024 * MIB, now=10.0)
    return predictor


def test_placed_pod_counts_at_once() -> None:
    predictor = _fresh_with_pod()
    batch = predict_one(predictor, "n", 10.0)
    assert batch.cpu_used_milli[0] == pytest.approx(1500.0)
    assert batch.mem_used_bytes[0] == pytest.approx(2048 * MIB)


def test_report_within_settle_delay_does_not_cover_the_pod() -> None:
    predictor = _fresh_with_pod(cpu_alpha=1.0, memory_alpha=1.0)
    report(predictor, "n", 25.0, cpu=1000.0, mem=1024 * MIB)  # placed 10 + settle 20 = 30
    assert predictor.inflight_pods("n") == ("ns/p",)
    assert predict_one(predictor, "n", 25.0).cpu_used_milli[0] == pytest.approx(1500.0)


def test_covering_report_removes_the_estimate_when_alpha_is_one() -> None:
    predictor = _fresh_with_pod(cpu_alpha=1.0, memory_alpha=1.0)
    report(predictor, "n", 31.0, cpu=1400.0, mem=2048 * MIB)
    assert predictor.inflight_pods("n") == ()
    assert predict_one(predictor, "n", 31.0).cpu_used_milli[0] == pytest.approx(1400.0)


def test_covered_estimate_fades_as_the_ewma_takes_the_pod_in() -> None:
    # The pod shows in usage after its settle delay (t > 30); the node goes 1000m -> 1500m.
    # Level + residual estimate stay at the true 1500 while the EWMA catches up.
    predictor = _fresh_with_pod(cpu_alpha=0.5, memory_alpha=0.5, inflight_min_weight=0.1)
    totals = []
    for t in (15.0, 30.0, 45.0, 60.0, 75.0, 90.0):
        report(predictor, "n", t, cpu=1000.0 if t <= 30 else 1500.0, mem=1024 * MIB)
        totals.append(predict_one(predictor, "n", t).cpu_used_milli[0])
    assert totals[:5] == pytest.approx([1500.0] * 5)
    # Weight 0.5^4 < 0.1 after the 4th covering report: dropped, the level is 1500 - 500/16.
    assert predictor.inflight_pods("n") == ()
    assert totals[5] == pytest.approx(1500.0 - 500.0 / 16)


def test_min_weight_one_drops_at_first_covering_report() -> None:
    predictor = _fresh_with_pod(cpu_alpha=0.5, memory_alpha=0.5, inflight_min_weight=1.0)
    report(predictor, "n", 31.0, cpu=1000.0, mem=1024 * MIB)
    assert predictor.inflight_pods("n") == ()


def test_forget_pod_removes_the_estimate() -> None:
    predictor = _fresh_with_pod()
    assert predictor.forget_pod("ns/p") is True
    assert predictor.forget_pod("ns/p") is False
    assert predict_one(predictor, "n", 10.0).cpu_used_milli[0] == pytest.approx(1000.0)


def test_replacement_moves_the_estimate_to_the_new_node() -> None:
    predictor = _fresh_with_pod()
    report(predictor, "m", 0.0, cpu=0.0)
    predictor.note_placement("m", "ns/p", 500, 0, now=11.0)
    assert predictor.inflight_pods("n") == ()
    assert predictor.inflight_pods("m") == ("ns/p",)


def test_noting_the_same_placement_again_keeps_its_time() -> None:
    predictor = _fresh_with_pod(cpu_alpha=1.0, memory_alpha=1.0)
    predictor.note_placement("n", "ns/p", 500, 1024 * MIB, now=29.0)  # replayed event
    report(predictor, "n", 31.0, cpu=1500.0, mem=2048 * MIB)  # covers the placement at 10
    assert predictor.inflight_pods("n") == ()


def test_forget_node_drops_its_pods() -> None:
    predictor = _fresh_with_pod()
    assert predictor.forget_node("n") is True
    assert predictor.forget_pod("ns/p") is False
    assert predictor.status("n", 10.0) is LoadStatus.UNKNOWN


def test_replace_config_keeps_series_and_rescales_estimates_at_once() -> None:
    predictor = _fresh_with_pod()
    predictor.replace_config(PredictConfig(settle_delay_s=20.0, cpu_request_scale=2.0))
    assert predict_one(predictor, "n", 10.0).cpu_used_milli[0] == pytest.approx(2000.0)
    assert predictor.config.cpu_request_scale == 2.0


# --- staleness ------------------------------------------------------------


def test_stale_node_falls_back_to_requests_and_is_flagged() -> None:
    predictor = make_predictor(stale_after_s=45.0)
    report(predictor, "n", 0.0, cpu=3900.0, psi=PsiSample(cpu_some=50.0))
    predictor.note_placement("n", "ns/p", 500, 0, now=1.0)
    fresh = predict_one(predictor, "n", 45.0, requested=(1000, 0), allocatable=(3800, MEM_CAP))
    assert fresh.status[0] == LoadStatus.FRESH
    assert fresh.cpu_used_milli[0] == pytest.approx(4400.0)
    stale = predict_one(predictor, "n", 45.5, requested=(1000, 0), allocatable=(3800, MEM_CAP))
    assert stale.status[0] == LoadStatus.STALE
    # Requests already include the assumed pod: no in-flight estimate on top.
    assert stale.cpu_used_milli[0] == 1000.0
    assert stale.cpu_capacity_milli[0] == 3800.0
    assert stale.age_s[0] == pytest.approx(45.5)
    assert math.isnan(stale.cpu_pressure[0])


def test_unknown_node_uses_requests() -> None:
    predictor = make_predictor()
    predictor.note_placement("n", "ns/p", 500, 0, now=0.0)
    batch = predict_one(
        predictor, "n", 0.0, requested=(2000, 8 * MIB), allocatable=(4000, 16 * MIB)
    )
    assert batch.status[0] == LoadStatus.UNKNOWN
    assert batch.cpu_utilisation[0] == pytest.approx(0.5)
    assert batch.memory_utilisation[0] == pytest.approx(0.5)
    assert math.isnan(batch.age_s[0])


def test_series_restarts_after_an_outage() -> None:
    predictor = make_predictor(cpu_alpha=0.1, stale_after_s=45.0)
    report(predictor, "n", 0.0, cpu=0.0)
    report(predictor, "n", 600.0, cpu=2000.0)
    assert predict_one(predictor, "n", 600.0).cpu_used_milli[0] == pytest.approx(2000.0)


def test_trend_projects_to_now_plus_horizon_and_is_clamped_to_capacity() -> None:
    predictor = make_predictor(cpu_alpha=1.0, trend_beta=1.0, horizon_s=30.0)
    report(predictor, "n", 0.0, cpu=1000.0)
    report(predictor, "n", 15.0, cpu=1600.0)  # +40 m/s
    assert predict_one(predictor, "n", 20.0).cpu_used_milli[0] == pytest.approx(1600.0 + 40 * 35)
    report(predictor, "n", 30.0, cpu=3900.0)
    assert predict_one(predictor, "n", 30.0).cpu_used_milli[0] == CPU_CAP


# --- batch and breakdown --------------------------------------------------


def test_batch_keeps_node_order_and_mixes_statuses() -> None:
    predictor = make_predictor()
    report(predictor, "fresh", 100.0, cpu=2000.0, psi=PsiSample(cpu_some=12.0, memory_some=3.0))
    report(predictor, "stale", 0.0, cpu=2000.0)
    nodes = ["unknown", "fresh", "stale"]
    batch = predictor.predict(
        nodes,
        np.array([100, 200, 300], dtype=np.int64),
        np.zeros(3, dtype=np.int64),
        np.full(3, 1000, dtype=np.int64),
        np.full(3, MEM_CAP, dtype=np.int64),
        now=110.0,
    )
    assert batch.nodes == tuple(nodes)
    assert len(batch) == 3
    assert batch.status.tolist() == [LoadStatus.UNKNOWN, LoadStatus.FRESH, LoadStatus.STALE]
    assert batch.cpu_utilisation.tolist() == pytest.approx([0.1, 0.5, 0.3])
    assert batch.cpu_pressure[1] == 12.0
    assert batch.memory_pressure[1] == 3.0
    assert np.isnan(batch.cpu_pressure[[0, 2]]).all()
    with pytest.raises(ValueError, match="read-only"):
        batch.cpu_used_milli[0] = 0.0


def test_predict_rejects_mismatched_arrays() -> None:
    with pytest.raises(ValueError, match="requested_mem_bytes"):
        make_predictor().predict(
            ["a", "b"], np.zeros(2), np.zeros(3), np.zeros(2), np.zeros(2), now=0.0
        )


def test_explain_breaks_the_prediction_down() -> None:
    predictor = make_predictor(cpu_alpha=0.5, memory_alpha=0.5)
    report(predictor, "n", 0.0, cpu=1000.0, mem=1000.0)
    report(predictor, "n", 15.0, cpu=2000.0, mem=1000.0, psi=PsiSample(cpu_some=1.0))
    predictor.note_placement("n", "ns/p", 300, 500, now=16.0)
    view = predictor.explain(
        "n", requested=CpuMem(700, 9000), allocatable=CpuMem(3000, 10000), now=20.0
    )
    assert view.status is LoadStatus.FRESH
    assert view.age_s == pytest.approx(5.0)
    assert view.measured == CpuMem(2000.0, 1000.0)
    assert view.predicted == CpuMem(1500.0, 1000.0)
    assert view.inflight == CpuMem(300.0, 500.0)
    assert view.inflight_pods == ("ns/p",)
    assert view.total == CpuMem(1800.0, 1500.0)
    assert view.capacity == CpuMem(CPU_CAP, MEM_CAP)
    assert view.utilisation.cpu == pytest.approx(1800.0 / CPU_CAP)
    assert view.psi == PsiSample(cpu_some=1.0)


def test_explain_unknown_node() -> None:
    view = make_predictor().explain(
        "n", requested=CpuMem(700, 9000), allocatable=CpuMem(0, 10000), now=0.0
    )
    assert view.status is LoadStatus.UNKNOWN
    assert view.age_s is None
    assert view.measured is None
    assert view.predicted is None
    assert view.total == CpuMem(700, 9000)
    assert view.utilisation.cpu == math.inf
    assert view.psi is None


def test_may_have_fresh_follows_the_newest_report() -> None:
    predictor = make_predictor(stale_after_s=45.0)
    assert not predictor.may_have_fresh(0.0)  # nothing reported: no agent on this cluster
    predictor.note_placement("n", "ns/p", 500, 0, now=0.0)
    assert not predictor.may_have_fresh(0.0)  # a placement alone is no report
    report(predictor, "n", 10.0)
    assert predictor.may_have_fresh(55.0)
    assert not predictor.may_have_fresh(55.5)
    report(predictor, "m", 50.0)
    assert predictor.may_have_fresh(95.0)


@settings(max_examples=200, deadline=None)
@given(
    times=st.lists(st.floats(0.0, 200.0), min_size=0, max_size=6),
    now=st.floats(0.0, 300.0),
)
def test_may_have_fresh_is_false_only_when_no_node_is_fresh(times: list[float], now: float) -> None:
    """The short cut LoadAware takes must never hide a fresh node."""
    predictor = make_predictor(stale_after_s=45.0)
    nodes = [f"n{i}" for i in range(len(times))]
    for node, t in zip(nodes, times, strict=True):
        predictor.observe(node, t, 100.0, 0.0, CPU_CAP, MEM_CAP)
    predictor.forget_node("n0")
    batch = predictor.predict(
        nodes,
        np.zeros(len(nodes), dtype=np.int64),
        np.zeros(len(nodes), dtype=np.int64),
        np.full(len(nodes), CPU_CAP, dtype=np.int64),
        np.full(len(nodes), MEM_CAP, dtype=np.int64),
        now=now,
    )
    if not predictor.may_have_fresh(now):
        assert not (batch.status == LoadStatus.FRESH).any()
    else:
        newest = max(times)
        assert now - newest <= 45.0

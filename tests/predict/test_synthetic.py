"""Synthetic load: reproducible, hotspots rise and fall, load follows pods; end to end."""

from __future__ import annotations

import numpy as np
import pytest

from lattice_dev.predict.synthetic import (
    Hotspot,
    PodLoad,
    SyntheticLoad,
    SyntheticNode,
    make_fleet,
)
from scheduler.predict import LoadPredictor, LoadReport, PodEstimate, least_loaded_scores

GIB = 1024**3


def _quiet(name: str, *, base_cpu: float = 0.1, base_memory: float = 0.2) -> SyntheticNode:
    return SyntheticNode(
        name=name, base_cpu=base_cpu, base_memory=base_memory, noise_cpu=0.0, noise_memory=0.0
    )


def test_same_seed_same_samples_and_order_does_not_matter() -> None:
    fleet = make_fleet(5, seed=7)
    a = SyntheticLoad(fleet, seed=42)
    b = SyntheticLoad(make_fleet(5, seed=7), seed=42)
    times = [0.0, 15.0, 30.0]
    forward = [a.sample_all(t) for t in times]
    backward = [b.sample_all(t) for t in reversed(times)][::-1]
    assert forward == backward
    assert a.sample(fleet[3].name, 15.0) == forward[1][3]


def test_other_seed_other_noise() -> None:
    fleet = make_fleet(3, seed=7)
    a = SyntheticLoad(fleet, seed=1).sample_all(0.0)
    b = SyntheticLoad(fleet, seed=2).sample_all(0.0)
    assert [r.cpu_used_milli for r in a] != [r.cpu_used_milli for r in b]


def test_fleet_is_reproducible_and_named_in_order() -> None:
    fleet = make_fleet(12, seed=3, prefix="w-")
    assert fleet == make_fleet(12, seed=3, prefix="w-")
    assert [n.name for n in fleet[:2]] == ["w-000", "w-001"]
    assert all(0.05 <= n.base_cpu <= 0.5 for n in fleet)


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        SyntheticLoad([_quiet("a"), _quiet("a")], seed=0)


@pytest.mark.parametrize(
    ("t", "intensity"),
    [
        pytest.param(99.0, 0.0, id="before"),
        pytest.param(110.0, 0.5, id="rising"),
        pytest.param(150.0, 1.0, id="plateau"),
        pytest.param(190.0, 0.5, id="falling"),
        pytest.param(201.0, 0.0, id="after"),
    ],
)
def test_hotspot_is_a_trapezoid(t: float, intensity: float) -> None:
    hotspot = Hotspot(nodes=frozenset({"a"}), start=100.0, duration_s=100.0, ramp_s=20.0)
    assert hotspot.intensity(t) == pytest.approx(intensity)


def test_hotspot_heats_only_its_nodes_and_is_clipped_with_pressure() -> None:
    nodes = [_quiet("hot", base_cpu=0.5), _quiet("cold", base_cpu=0.5)]
    hot = Hotspot(nodes=frozenset({"hot"}), start=10.0, duration_s=10.0, cpu=0.9)
    load = SyntheticLoad(nodes, seed=0, hotspots=[hot])
    during = {r.node: r for r in load.sample_all(15.0)}
    assert during["hot"].cpu_used_milli == 4000.0  # demand 140 % clipped to capacity
    assert during["hot"].psi.cpu_some == 100.0
    assert during["cold"].cpu_used_milli == pytest.approx(2000.0)
    assert during["cold"].psi.cpu_some == 0.0
    assert load.sample("hot", 25.0).cpu_used_milli == pytest.approx(2000.0)


def test_load_follows_pods_after_warmup() -> None:
    load = SyntheticLoad([_quiet("a", base_cpu=0.0, base_memory=0.0)], seed=0)
    pod = PodLoad(
        cpu_request_milli=1000,
        mem_request_bytes=GIB,
        usage_ratio=0.5,
        memory_usage_ratio=1.0,
        started_at=100.0,
        warmup_s=20.0,
    )
    assert load.sample("a", 90.0, [pod]).cpu_used_milli == 0.0
    assert load.sample("a", 110.0, [pod]).cpu_used_milli == pytest.approx(250.0)
    warm = load.sample("a", 130.0, [pod, pod])
    assert warm.cpu_used_milli == pytest.approx(1000.0)
    assert warm.mem_used_bytes == 2 * GIB


def test_report_times_are_reproducible_with_jitter_and_drops() -> None:
    load = SyntheticLoad(make_fleet(1, seed=0), seed=9)
    times = load.report_times("node-000", 0.0, 15.0 * 400, jitter_s=3.0, drop_probability=0.2)
    assert times == load.report_times(
        "node-000", 0.0, 15.0 * 400, jitter_s=3.0, drop_probability=0.2
    )
    assert times == sorted(times)
    assert 250 < len(times) < 350
    with pytest.raises(ValueError, match="interval_s"):
        load.report_times("node-000", 0.0, 1.0, interval_s=0.0)


def test_end_to_end_hotspot_lowers_then_restores_the_score() -> None:
    nodes = make_fleet(4, seed=5, base_cpu=(0.2, 0.2), base_memory=(0.3, 0.3))
    hot = Hotspot(
        nodes=frozenset({nodes[0].name}), start=300.0, duration_s=300.0, cpu=0.7, ramp_s=30.0
    )
    load = SyntheticLoad(nodes, seed=11, hotspots=[hot])
    predictor = LoadPredictor()
    names = [n.name for n in nodes]
    zeros = np.zeros(len(names), dtype=np.int64)
    alloc_cpu = np.full(len(names), 4000, dtype=np.int64)
    alloc_mem = np.full(len(names), 16 * GIB, dtype=np.int64)
    pod = PodEstimate(cpu_milli=500.0, memory_bytes=float(GIB))
    best: dict[float, str] = {}
    hot_scores: dict[float, int] = {}
    for t in np.arange(0.0, 1200.0, 15.0):
        for sample in load.sample_all(float(t)):
            assert isinstance(sample, LoadReport)
            predictor.observe_report(sample, now=float(t))
        batch = predictor.predict(names, zeros, zeros, alloc_cpu, alloc_mem, now=float(t))
        scores = least_loaded_scores(batch, pod)
        best[float(t)] = names[int(np.argmax(scores))]
        hot_scores[float(t)] = int(scores[0])
    assert hot_scores[555.0] < hot_scores[285.0] - 20
    assert best[555.0] != names[0]
    assert abs(hot_scores[1185.0] - hot_scores[285.0]) <= 3

"""Metrics: one definition per name, conventional names, isolated registries."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from scheduler.control.lifecycle import PodState
from scheduler.control.queue import QueueName
from scheduler.obs.metrics import (
    CACHE_POD_STATES,
    KUBE_SCHEDULER_NAMES,
    QUEUE_LABELS,
    AttemptResult,
    Metrics,
    PluginTimer,
    attempts_label,
)

NAME = re.compile(
    r"^lattice_(scheduling|framework|queue|binding|graph|cache|load|gang|reports|gpu|dra|quota)_[a-z0-9_]+$"
)
UNIT_BY_TYPE = {
    "counter": ("_total",),
    # A histogram of counts (CEL evaluations per attempt) is unitless, named for what it counts.
    "histogram": ("_seconds", "_evaluations"),
    # Quota amounts mix units (cores, bytes, devices): the resource label says which.
    "gauge": ("_pods", "_nodes", "_gangs", "_devices", "_units"),
}


def _sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def _families(metrics: Metrics) -> dict[str, str]:
    """Exposed name -> type; counters are exposed with their ``_total`` suffix."""
    return {
        (f"{f.name}_total" if f.type == "counter" else f.name): f.type
        for f in metrics.registry.collect()
    }


def _ours(metrics: Metrics) -> dict[str, str]:
    return {n: k for n, k in _families(metrics).items() if n.startswith("lattice_")}


def test_every_metric_follows_the_naming_convention() -> None:
    families = _ours(Metrics.create())
    assert len(families) == 28
    for name, kind in families.items():
        assert NAME.match(name), name
        assert name.endswith(UNIT_BY_TYPE[kind]), (name, kind)


def test_beside_ours_only_kube_scheduler_names_and_process_collectors() -> None:
    families = _families(Metrics.create())
    others = {n for n in families if not n.startswith("lattice_")}
    assert {n for n in others if n.startswith("scheduler_")} == set(KUBE_SCHEDULER_NAMES)
    rest = others - set(KUBE_SCHEDULER_NAMES)
    assert all(n.startswith(("process_", "python_")) for n in rest), rest
    assert "python_info" in rest
    assert "process_cpu_seconds_total" in rest  # Linux: read from /proc


def test_kube_scheduler_names_have_kube_scheduler_labels() -> None:
    metrics = Metrics.create()
    metrics.precreate_profile("lattice")
    metrics.set_pending({"active": 1})
    metrics.observe_sli(0.5, attempts=2)
    PluginTimer(metrics.plugin_execution_duration, sample_every=1).observe(
        "NodeResourcesFit", "Filter", "Success", 1e-4
    )
    labels = {
        f.name: {k for s in f.samples for k in s.labels if k != "le"}
        for f in metrics.registry.collect()
    }
    assert labels["scheduler_schedule_attempts"] == {"result", "profile"}
    assert labels["scheduler_pending_pods"] == {"queue"}
    assert labels["scheduler_pod_scheduling_sli_duration_seconds"] == {"attempts"}
    assert labels["scheduler_plugin_execution_duration_seconds"] == {
        "plugin",
        "extension_point",
        "status",
    }
    assert _sample(metrics, "scheduler_pending_pods", queue="active") == 1
    assert _sample(metrics, "scheduler_pending_pods", queue="gated") == 0
    for result in AttemptResult:
        assert (
            _sample(metrics, "scheduler_schedule_attempts_total", result=result, profile="lattice")
            == 0
        )


@pytest.mark.parametrize(("attempts", "label"), [(1, "1"), (14, "14"), (15, "15+"), (99, "15+")])
def test_sli_attempts_are_capped_as_kube_scheduler_caps_them(attempts: int, label: str) -> None:
    assert attempts_label(attempts) == label
    metrics = Metrics.create()
    metrics.observe_sli(3.0, attempts=attempts)
    assert (
        _sample(metrics, "scheduler_pod_scheduling_sli_duration_seconds_count", attempts=label) == 1
    )


def test_expected_names() -> None:
    assert set(_ours(Metrics.create())) == {
        "lattice_scheduling_attempts_total",
        "lattice_scheduling_cycle_duration_seconds",
        "lattice_scheduling_e2e_duration_seconds",
        "lattice_queue_pending_pods",
        "lattice_binding_duration_seconds",
        "lattice_binding_errors_total",
        "lattice_dra_allocations_total",
        "lattice_dra_double_allocations_total",
        "lattice_dra_prebind_conflicts_total",
        "lattice_dra_binding_condition_waits_total",
        "lattice_dra_binding_condition_wait_seconds",
        "lattice_dra_allocation_duration_seconds",
        "lattice_dra_cel_evaluations",
        "lattice_graph_patches_total",
        "lattice_cache_size_nodes",
        "lattice_cache_size_pods",
        "lattice_load_reports_total",
        "lattice_load_nodes",
        "lattice_gang_attempts_total",
        "lattice_gang_solve_duration_seconds",
        "lattice_gang_invalid_plans_total",
        "lattice_gang_partial_gangs",
        "lattice_gang_admit_duration_seconds",
        "lattice_scheduling_batched_cycles_total",
        "lattice_reports_dropped_total",
        "lattice_gpu_devices",
        "lattice_quota_resource_units",
        "lattice_quota_reclaim_evictions_total",
    }


def test_registries_are_isolated() -> None:
    one, two = Metrics.create(), Metrics.create()
    one.observe_attempt(AttemptResult.SCHEDULED, 0.01)
    assert _sample(one, "lattice_scheduling_attempts_total", result="scheduled") == 1
    assert _sample(two, "lattice_scheduling_attempts_total", result="scheduled") == 0


def test_a_registry_takes_the_set_once() -> None:
    registry = CollectorRegistry()
    Metrics.create(registry)
    with pytest.raises(ValueError, match="Duplicated"):
        Metrics.create(registry)


def test_fixed_label_values_exist_before_any_event() -> None:
    metrics = Metrics.create()
    for result in AttemptResult:
        assert _sample(metrics, "lattice_scheduling_attempts_total", result=result) == 0
    for queue in QUEUE_LABELS:
        assert _sample(metrics, "lattice_queue_pending_pods", queue=queue) == 0
    for state in CACHE_POD_STATES:
        assert _sample(metrics, "lattice_cache_size_pods", state=state) == 0


@pytest.mark.parametrize("result", list(AttemptResult), ids=str)
def test_observe_attempt(result: AttemptResult) -> None:
    metrics = Metrics.create()
    metrics.observe_attempt(result, 0.003)
    assert _sample(metrics, "lattice_scheduling_attempts_total", result=result) == 1
    assert _sample(metrics, "lattice_scheduling_cycle_duration_seconds_count", result=result) == 1
    assert (
        _sample(
            metrics, "lattice_scheduling_cycle_duration_seconds_bucket", result=result, le="0.004"
        )
        == 1
    )


def test_set_pending_takes_the_queue_counts() -> None:
    metrics = Metrics.create()
    metrics.set_pending({QueueName.ACTIVE: 3, QueueName.GATED: 1, QueueName.IN_FLIGHT: 7})
    expected = {"active": 3, "backoff": 0, "unschedulable": 0, "gated": 1}
    for queue, value in expected.items():
        assert _sample(metrics, "lattice_queue_pending_pods", queue=queue) == value
    assert _sample(metrics, "lattice_queue_pending_pods", queue="in_flight") is None


def test_set_cache_size_takes_the_lifecycle_counts() -> None:
    metrics = Metrics.create()
    metrics.set_cache_size(4, {PodState.INITIAL: 0, PodState.ASSUMED: 2, PodState.ADDED: 9})
    assert _sample(metrics, "lattice_cache_size_nodes") == 4
    assert _sample(metrics, "lattice_cache_size_pods", state="assumed") == 2
    assert _sample(metrics, "lattice_cache_size_pods", state="bound") == 0
    assert _sample(metrics, "lattice_cache_size_pods", state="added") == 9
    assert _sample(metrics, "lattice_cache_size_pods", state="initial") is None


def test_open_label_metrics_and_exposition() -> None:
    metrics = Metrics.create()
    timer = PluginTimer(metrics.plugin_execution_duration)
    timer.observe("NodeResourcesFit", "Filter", "Success", 1e-4)
    metrics.bind_duration.observe(0.02)
    metrics.bind_errors.inc()
    metrics.graph_patches.inc(3)
    metrics.e2e_scheduling_duration.observe(1.5)
    text = generate_latest(metrics.registry).decode()
    assert (
        'scheduler_plugin_execution_duration_seconds_count{extension_point="Filter",'
        'plugin="NodeResourcesFit",status="Success"} 1.0' in text
    )
    assert "lattice_binding_errors_total 1.0" in text
    assert "lattice_graph_patches_total 3.0" in text
    assert "lattice_scheduling_e2e_duration_seconds_count 1.0" in text


def test_set_quotas_publishes_and_drops_stale_series() -> None:
    metrics = Metrics.create()
    gauge = "lattice_quota_resource_units"
    metrics.set_quotas(
        [
            ("team-a", "q", "nvidia.com/gpu", "used", 14.0),
            ("team-a", "q", "nvidia.com/gpu", "max", 16.0),
            ("team-b", "q", "cpu", "min", 2.5),
        ]
    )
    labels = {"namespace": "team-a", "quota": "q", "resource": "nvidia.com/gpu"}
    assert _sample(metrics, gauge, **labels, bound="used") == 14.0
    assert _sample(metrics, gauge, **labels, bound="max") == 16.0
    assert metrics.quota_series == 3
    metrics.set_quotas([("team-a", "q", "nvidia.com/gpu", "used", 15.0)])
    assert _sample(metrics, gauge, **labels, bound="used") == 15.0
    assert _sample(metrics, gauge, **labels, bound="max") is None
    assert (
        _sample(metrics, gauge, namespace="team-b", quota="q", resource="cpu", bound="min") is None
    )
    assert metrics.quota_series == 1


def test_reclaim_evictions_are_counted_per_quota() -> None:
    metrics = Metrics.create()
    name = "lattice_quota_reclaim_evictions_total"
    assert _sample(metrics, name, namespace="team-a", quota="q") is None  # no series before
    metrics.reclaim_eviction("team-a", "q")
    metrics.reclaim_eviction("team-a", "q")
    metrics.reclaim_eviction("team-b", "q")
    assert _sample(metrics, name, namespace="team-a", quota="q") == 2.0
    assert _sample(metrics, name, namespace="team-b", quota="q") == 1.0

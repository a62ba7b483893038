"""The gang benchmark's pure parts: the seeded stream and the figures built from a timeline."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from lattice_dev.benchmarks.gangs import (
    GPU,
    ArmSummary,
    GangArrival,
    GangWindow,
    PodRecord,
    SingleArrival,
    SolveSample,
    StreamConfig,
    fleet_samples,
    gang_outcome,
    gang_sizes,
    gang_spec,
    generate_stream,
    json_safe,
    parse_metrics,
    parse_solve_lines,
    pod_body,
    report_lines,
    sample_times,
    serving_port,
    solve_by_size,
    summarize,
    verdict_lines,
)
from scheduler.model.gang import POD_GROUP_LABEL

# --- the stream ----------------------------------------------------------------------------


def test_stream_is_deterministic_for_a_seed() -> None:
    config = StreamConfig(gangs=30, singles=50, duration_s=60.0)
    assert generate_stream(3, config) == generate_stream(3, config)
    assert generate_stream(3, config) != generate_stream(4, config)


def test_stream_respects_counts_ranges_and_order() -> None:
    config = StreamConfig(gangs=200, singles=300, duration_s=90.0)
    stream = generate_stream(11, config)
    gangs = [a for a in stream if isinstance(a, GangArrival)]
    singles = [a for a in stream if isinstance(a, SingleArrival)]
    assert (len(gangs), len(singles)) == (200, 300)
    assert [a.at for a in stream] == sorted(a.at for a in stream)
    assert all(0.0 <= a.at <= 90.0 for a in stream)
    member_gpus = {k for g in gangs for k in g.member_gpus}
    assert {g.members for g in gangs} <= set(range(2, 17))
    assert member_gpus <= set(range(1, 9))
    assert {s.gpus for s in singles} <= {1, 2}
    # 200 draws cover the ends of the ranges: the bounds are inclusive, not off by one.
    assert min(g.members for g in gangs) == 2
    assert max(g.members for g in gangs) == 16
    assert {min(member_gpus), max(member_gpus)} == {1, 8}
    assert {s.gpus for s in singles} == {1, 2}
    # about half the gangs mixed (the default share), the others uniform
    mixed = sum(1 for g in gangs if g.mixed)
    assert 70 <= mixed <= 130
    assert all(20.0 <= g.lifetime_s <= 60.0 for g in gangs)
    assert all(5.0 <= s.lifetime_s <= 30.0 for s in singles)
    assert all(a.lifetime_s > 0 for a in stream)
    assert len({a.name for a in stream}) == len(stream)


def test_stream_mixed_share_decides_whether_members_differ() -> None:
    def gangs(share: float) -> list[GangArrival]:
        config = StreamConfig(gangs=50, singles=0, mixed_share=share, gang_size=(4, 16))
        return [a for a in generate_stream(2, config) if isinstance(a, GangArrival)]

    assert not any(g.mixed for g in gangs(0.0))
    # four or more members drawing 1-8 each are all equal with odds below 1/500
    assert sum(1 for g in gangs(1.0) if g.mixed) >= 48


def test_stream_gangs_do_not_depend_on_the_singles() -> None:
    def gangs(singles: int) -> list[GangArrival]:
        config = StreamConfig(gangs=20, singles=singles, duration_s=60.0)
        return [a for a in generate_stream(5, config) if isinstance(a, GangArrival)]

    assert gangs(0) == gangs(400)


def test_stream_member_names_and_sizes() -> None:
    gang = GangArrival(at=1.0, name="g-004", member_gpus=(2, 4, 2), lifetime_s=10.0)
    assert gang.member_names() == ("g-004-00", "g-004-01", "g-004-02")
    assert (gang.members, gang.mixed) == (3, True)
    single = SingleArrival(at=0.5, name="s-0001", gpus=1, lifetime_s=5.0)
    assert gang_sizes([single, gang]) == {"g-004": 3}


def test_stream_rejects_an_empty_duration() -> None:
    with pytest.raises(ValueError, match="duration"):
        generate_stream(1, StreamConfig(duration_s=0.0))


# --- one gang's outcome --------------------------------------------------------------------


def _members(
    name: str, gpus: int | list[int], binds: list[float | None], node: str = "n0"
) -> dict[str, PodRecord]:
    each = gpus if isinstance(gpus, list) else [gpus] * len(binds)
    return {
        f"{name}-{i:02d}": PodRecord(
            f"{name}-{i:02d}",
            each[i],
            gang=name,
            created=1.0,
            bound=b,
            node=node if b is not None else None,
        )
        for i, b in enumerate(binds)
    }


def _window(name: str, size: int, opened: float, closed: float | None) -> GangWindow:
    return GangWindow(name, tuple(f"{name}-{i:02d}" for i in range(size)), opened, closed)


def test_admitted_gang_time_to_admit_and_pre_admit_hold() -> None:
    pods = _members("g", 4, [2.0, 2.5, 3.0])
    out = gang_outcome(_window("g", 3, opened=1.5, closed=40.0), pods, horizon=100.0)
    assert out.admitted
    assert not out.partial
    assert out.time_to_admit_s == pytest.approx(1.5)
    assert out.stranded_gpu_s == 0.0
    # held while siblings were pending: 4 GPUs x (1.0 + 0.5 + 0) s
    assert out.pre_admit_gpu_s == pytest.approx(6.0)


def test_partial_gang_strands_its_bound_members_gpus_until_the_window_closes() -> None:
    pods = _members("g", 8, [5.0, 10.0, None, None])
    out = gang_outcome(_window("g", 4, opened=4.0, closed=34.0), pods, horizon=100.0)
    assert out.partial
    assert not out.admitted
    assert out.bound_at_close == 2
    assert out.time_to_admit_s is None
    assert out.stranded_gpu_s == pytest.approx(8 * (34.0 - 5.0) + 8 * (34.0 - 10.0))


def test_a_mixed_gang_strands_each_members_own_gpus() -> None:
    pods = _members("g", [2, 4, 2], [1.0, None, 3.0])
    out = gang_outcome(_window("g", 3, opened=0.5, closed=10.0), pods, horizon=20.0)
    assert out.partial
    assert out.gpus == 8
    assert out.stranded_gpu_s == pytest.approx(2 * 9.0 + 2 * 7.0)


def test_gang_with_nothing_bound_is_unadmitted_but_not_partial() -> None:
    pods = _members("g", 2, [None, None])
    out = gang_outcome(_window("g", 2, opened=0.0, closed=30.0), pods, horizon=50.0)
    assert (out.admitted, out.partial, out.stranded_gpu_s) == (False, False, 0.0)


def test_a_binding_after_the_window_closed_does_not_admit() -> None:
    pods = _members("g", 1, [3.0, 31.0])
    out = gang_outcome(_window("g", 2, opened=1.0, closed=30.0), pods, horizon=50.0)
    assert out.partial
    assert out.bound_at_close == 1
    assert out.stranded_gpu_s == pytest.approx(27.0)


def test_a_window_the_arm_cut_short_closes_at_the_horizon() -> None:
    pods = _members("g", 2, [10.0, None])
    out = gang_outcome(_window("g", 2, opened=9.0, closed=None), pods, horizon=20.0)
    assert out.partial
    assert out.stranded_gpu_s == pytest.approx(2 * 10.0)


# --- the fleet -----------------------------------------------------------------------------


def test_fleet_samples_count_fragmented_free_gpus_on_partly_used_nodes() -> None:
    pods = [
        PodRecord("a", 3, bound=1.0, node="n0", deleted=6.0, gone=6.2),
        PodRecord("b", 8, bound=2.0, node="n1"),
        PodRecord("c", 2, bound=None),  # never bound: holds nothing
        PodRecord("d", 1, bound=4.0, node="n2", deleted=5.0),  # watch missed the deletion
    ]
    nodes = {"n0": 8, "n1": 8, "n2": 8}
    s = {x.at: x for x in fleet_samples(pods, nodes, [0.0, 1.5, 4.5, 6.1, 7.0])}
    assert (s[0.0].used, s[0.0].fragmented, s[0.0].empty_nodes) == (0, 0, 3)
    assert (s[1.5].used, s[1.5].fragmented, s[1.5].empty_nodes) == (3, 5, 2)
    # n0 3/8 and n2 1/8 used: 5 + 7 free GPUs on partly used nodes; n1 full
    assert (s[4.5].used, s[4.5].free, s[4.5].fragmented, s[4.5].empty_nodes) == (12, 12, 12, 0)
    # the delete was sent at 6.0 but the pod is gone only at 6.2: still held at 6.1
    assert s[6.1].used == 11
    assert (s[7.0].used, s[7.0].fragmented, s[7.0].empty_nodes) == (8, 0, 2)


def test_sample_times_include_both_ends() -> None:
    assert sample_times(0.0, 3.0, 1.0) == [0.0, 1.0, 2.0, 3.0]
    assert sample_times(0.0, 2.5, 1.0) == [0.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="interval"):
        sample_times(0.0, 1.0, 0.0)


# --- a whole arm ---------------------------------------------------------------------------


NODES = {"n0": 8, "n1": 8, "n2": 8}


def _kube_like_timeline() -> tuple[dict[str, PodRecord], list[GangWindow]]:
    """Two gangs on three 8-GPU nodes: one admitted, one left partial; three singles."""
    pods = {
        **_members("g-000", 4, [1.0, 1.2], node="n0"),
        **_members("g-001", 8, [2.0, None, None], node="n1"),
        "s-0000": PodRecord("s-0000", 1, created=0.5, bound=0.7, node="n2", deleted=3.0),
        "s-0001": PodRecord("s-0001", 2, created=1.0, bound=1.5, node="n2", deleted=9.0),
        "s-0002": PodRecord("s-0002", 1, created=2.0),  # never bound
    }
    windows = [
        _window("g-000", 2, opened=0.9, closed=8.0),
        _window("g-001", 3, opened=1.8, closed=11.8),
    ]
    for name in ("g-000-00", "g-000-01"):
        pods[name].deleted = 8.0
    pods["g-001-00"].deleted = 11.8
    return pods, windows


def test_summarize_an_arm_from_a_hand_made_timeline() -> None:
    pods, windows = _kube_like_timeline()
    summary, outcomes, samples = summarize(
        "kube",
        pods=pods,
        windows=windows,
        node_gpus=NODES,
        horizon=20.0,
        duration=10.0,
        sample_interval=1.0,
    )
    assert [o.name for o in outcomes] == ["g-000", "g-001"]
    assert (summary.gangs, summary.admitted, summary.partial, summary.gave_up) == (2, 1, 1, 1)
    assert summary.tta_p50_s == pytest.approx(0.3)
    assert summary.stranded_gpu_s == pytest.approx(8 * (11.8 - 2.0))
    assert summary.avg_stranded_gpus == pytest.approx(8 * 9.8 / 20.0)
    assert summary.pre_admit_gpu_s == pytest.approx(4 * 0.2)
    assert (summary.singles, summary.singles_bound) == (3, 2)
    # 2 singles bound from the first arrival (0.5) to the last binding (1.5)
    assert summary.singles_per_s == pytest.approx(2.0)
    assert summary.single_p50_s == pytest.approx(0.35)
    assert len(samples) == 11
    at5 = next(s for s in samples if s.at == 5.0)
    # n0 full with g-000, n1 full with the partial gang's bound member, n2 2/8
    assert (at5.used, at5.free, at5.fragmented, at5.empty_nodes) == (18, 6, 6, 0)
    assert summary.gpu_util == pytest.approx(sum(x.used for x in samples) / (11 * 24))
    assert summary.solve_rows == ()


def test_summary_tables_and_targets_name_each_arm() -> None:
    pods, windows = _kube_like_timeline()
    kube, _, _ = summarize(
        "kube",
        pods=pods,
        windows=windows,
        node_gpus=NODES,
        horizon=20.0,
        duration=10.0,
        sample_interval=1.0,
    )
    cpsat = dataclasses.replace(kube, arm="cpsat", admitted=2, partial=0, stranded_gpu_s=0.0)
    greedy = dataclasses.replace(kube, arm="greedy", admitted=1, partial=0)
    lines = report_lines([cpsat, greedy, kube])
    gang_rows = [line for line in lines if line.startswith(("lattice", "kube-scheduler"))]
    assert gang_rows[0].split()[:6] == ["lattice", "CP-SAT", "2", "2", "1", "0"]
    assert gang_rows[2].split()[:5] == ["kube-scheduler", "2", "1", "1", "1"]
    verdicts = verdict_lines([cpsat, greedy, kube])
    assert verdicts[0] == (
        "target: CP-SAT admits more gangs than greedy on the same stream: 2 vs 1 (more)"
    )
    assert "target: 0 partial gangs (lattice CP-SAT): 0" in verdicts
    assert verdicts[-1].startswith("kube-scheduler: 1 partial gangs holding 78 GPU·s")


# --- Lattice's logs and metrics ------------------------------------------------------------


def test_parse_solve_lines_keeps_the_streams_gang_attempts() -> None:
    lines = [
        json.dumps({"event": "gang_assumed", "gang": "ns/g-001", "duration_ms": 12.5}),
        json.dumps({"event": "gang_unschedulable", "gang": "ns/g-002", "reason": "no room"}),
        json.dumps(
            {"event": "gang_unschedulable", "gang": "ns/g-002", "extra": {"duration_ms": 900}}
        ),
        json.dumps({"event": "gang_problem_built", "gang": "ns/g-001", "duration_ms": 3}),
        json.dumps({"event": "gang_assumed", "gang": "other/x", "duration_ms": 1}),
        '{"event": "gang_assumed", truncated',
        json.dumps({"event": "pod_bound", "pod": "ns/s-0001"}),
    ]
    samples = parse_solve_lines(lines, {"g-001": 4, "g-002": 16})
    assert samples == [
        SolveSample("g-001", 4, "gang_assumed", 12.5),
        SolveSample("g-002", 16, "gang_unschedulable", None),
        SolveSample("g-002", 16, "gang_unschedulable", 900.0),
    ]


def test_solve_by_size_groups_attempts() -> None:
    samples = [
        SolveSample("a", 2, "gang_assumed", 10.0),
        SolveSample("b", 3, "gang_unschedulable", 30.0),
        SolveSample("b", 3, "gang_assumed", None),
        SolveSample("c", 16, "gang_assumed", 700.0),
    ]
    rows = {r.sizes: r for r in solve_by_size(samples)}
    small = rows[(2, 4)]
    assert (small.attempts, small.assumed, small.timed) == (3, 2, 2)
    assert small.p50_ms == pytest.approx(20.0)
    assert small.max_ms == 30.0
    assert rows[(5, 8)].attempts == 0
    assert math.isnan(rows[(5, 8)].p50_ms)
    assert rows[(13, 16)].p99_ms == 700.0


METRICS = """\
# HELP lattice_gang_attempts_total Joint placements of a gang by solver outcome.
# TYPE lattice_gang_attempts_total counter
lattice_gang_attempts_total{outcome="optimal"} 7.0
lattice_gang_attempts_total{outcome="infeasible"} 2.0
# HELP lattice_gang_solve_duration_seconds Duration of one gang's solve.
# TYPE lattice_gang_solve_duration_seconds histogram
lattice_gang_solve_duration_seconds_bucket{le="0.1"} 5.0
lattice_gang_solve_duration_seconds_bucket{le="+Inf"} 9.0
lattice_gang_solve_duration_seconds_count 9.0
lattice_gang_solve_duration_seconds_sum 1.8
lattice_gang_solve_duration_seconds_created 1.7e9
# HELP lattice_gang_partial_gangs Gangs partly bound.
# TYPE lattice_gang_partial_gangs gauge
lattice_gang_partial_gangs 0.0
# HELP lattice_pods_bound_total Pods bound.
# TYPE lattice_pods_bound_total counter
lattice_pods_bound_total 50.0
"""


def test_parse_metrics_keeps_gang_figures_without_buckets() -> None:
    m = parse_metrics(METRICS)
    assert m == {
        "lattice_gang_attempts_total{outcome=optimal}": 7.0,
        "lattice_gang_attempts_total{outcome=infeasible}": 2.0,
        "lattice_gang_solve_duration_seconds_count": 9.0,
        "lattice_gang_solve_duration_seconds_sum": 1.8,
        "lattice_gang_partial_gangs": 0.0,
    }


def test_report_shows_scraped_metrics_for_lattice_arms() -> None:
    pods, windows = _kube_like_timeline()
    summary, _, _ = summarize(
        "cpsat",
        pods=pods,
        windows=windows,
        node_gpus=NODES,
        horizon=20.0,
        duration=10.0,
        sample_interval=1.0,
        solves=[SolveSample("g-000", 2, "gang_assumed", 4.0)],
        metrics=parse_metrics(METRICS),
        partial_gauge_max=0.0,
    )
    assert isinstance(summary, ArmSummary)
    metric_line = next(x for x in report_lines([summary]) if x.startswith("  lattice CP-SAT:"))
    assert "infeasible 2, optimal 7" in metric_line
    assert "solve mean 200.0 ms over 9" in metric_line
    assert "gangs_partial at end 0; max seen 0" in metric_line


def test_json_safe_turns_nan_into_null() -> None:
    assert json_safe({"a": [math.nan, 1.0], "b": (math.inf, "x")}) == {
        "a": [None, 1.0],
        "b": [None, "x"],
    }


def test_serving_port_is_read_from_the_serving_line() -> None:
    lines = [
        '{"event": "pod_bound", "reason": "metrics on nothing:1"}',
        '{"timestamp": "t", "level": "info", "event": "serving", '
        '"reason": "metrics on 127.0.0.1:41234"}',
    ]
    assert serving_port(lines) == 41234
    assert serving_port(lines[:1]) is None


# --- what is sent --------------------------------------------------------------------------


def test_pod_bodies_request_gpus_as_an_extended_resource() -> None:
    member = pod_body("g-001-00", 4, "lattice", "g-001")
    container = member["spec"]["containers"][0]
    assert container["resources"]["requests"][GPU] == "4"
    assert container["resources"]["limits"] == {GPU: "4"}
    assert member["metadata"]["labels"][POD_GROUP_LABEL] == "g-001"
    assert member["spec"]["schedulerName"] == "lattice"
    single = pod_body("s-0001", 1, "default-scheduler", None)
    assert POD_GROUP_LABEL not in single["metadata"]["labels"]
    assert single["spec"]["schedulerName"] == "default-scheduler"


def test_gang_spec_per_arm() -> None:
    assert gang_spec("greedy", 1.0) == {"solver": "Greedy", "solverTimeLimitSeconds": 1.0}
    assert gang_spec("cpsat", 0.5) == {"solver": "CPSAT", "solverTimeLimitSeconds": 0.5}

"""The replay: production profiles over a trace, with answers known in advance."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.core.gpus import GpuDemand
from scheduler.core.profile import DEFAULT_PROFILE, ScoringStrategy
from scheduler.model.pod import Pod
from scheduler.sim import KUBE_DEFAULT, KUBE_MOST_ALLOCATED, LATTICE, POLICY_NAMES
from scheduler.sim.replay import (
    PolicyResult,
    ReplayConfig,
    ReplayError,
    arrivals,
    format_table,
    policy_profile,
    replay,
    replay_policy,
)
from scheduler.sim.trace import Trace, load_alibaba
from tests.sim.traces import gpu_node, gpu_pod, small_then_whole, task

DATA = Path(__file__).resolve().parents[2] / "e2e" / "traces" / "alibaba-gpu-v2023"


def by_policy(results: list[PolicyResult]) -> dict[str, PolicyResult]:
    return {r.policy: r for r in results}


def test_spreading_strands_the_whole_node_task_and_packing_places_it() -> None:
    run = replay(small_then_whole(), [KUBE_DEFAULT, KUBE_MOST_ALLOCATED])
    results = by_policy(run.results)
    spread, packed = results[KUBE_DEFAULT], results[KUBE_MOST_ALLOCATED]
    # LeastAllocated: two 1-GPU tasks per node, so no node has 8 GPUs free.
    assert (spread.gpu_tasks.arrived, spread.gpu_tasks.placed) == (5, 4)
    assert (spread.multi_gpu_tasks.arrived, spread.multi_gpu_tasks.placed) == (1, 0)
    assert spread.unallocated_gpu_pct == pytest.approx(75.0)
    # MostAllocated (GPUs weighted 3): the 1-GPU tasks share one node, the other stays whole.
    assert (packed.gpu_tasks.placed, packed.multi_gpu_tasks.placed) == (5, 1)
    assert packed.unallocated_gpu_pct == pytest.approx(25.0)
    assert (run.gpus, run.arrived, run.arrived_gpus, run.nodes) == (16, 5, 12, 2)


def test_curve_has_a_point_per_percent_of_arrived_demand() -> None:
    run = replay(small_then_whole(), [KUBE_DEFAULT, KUBE_MOST_ALLOCATED])
    for result in run.results:
        xs = [x for x, _ in result.curve]
        assert xs == [float(x) for x in range(76)]  # 12 of 16 GPUs asked: 75 %
        assert result.curve[0] == (0.0, 100.0)
        # 1 GPU of 16 is 6.25 %: marks 1..6 are reached by the first task.
        assert [y for x, y in result.curve if 1 <= x <= 6] == [93.75] * 6
        assert result.curve[-1][1] == result.unallocated_gpu_pct
    results = by_policy(run.results)
    assert results[KUBE_DEFAULT].curve[-1] == (75.0, 75.0)
    assert results[KUBE_MOST_ALLOCATED].curve[-1] == (75.0, 25.0)


def test_arrivals_stop_once_the_demand_share_is_reached() -> None:
    trace = small_then_whole()
    assert [t.pod.name for t in arrivals(trace.tasks, 16, 25)] == [f"small-{i}" for i in range(4)]
    assert len(arrivals(trace.tasks, 16, 20)) == 4  # the task that crosses 20 % still arrives
    assert len(arrivals(trace.tasks, 16, 18.75)) == 3
    assert len(arrivals(trace.tasks, 16, 100)) == 5
    assert len(arrivals(trace.tasks, 0, 10)) == 5  # no GPUs: no demand share, all arrive
    run = replay(trace, [KUBE_DEFAULT], ReplayConfig(until_demand=25))
    (result,) = run.results
    assert (run.arrived, result.gpu_tasks.arrived, result.multi_gpu_tasks.arrived) == (4, 4, 0)
    assert result.curve[-1] == (25.0, 75.0)


def test_cpu_only_tasks_arrive_until_the_limit_and_are_counted_apart() -> None:
    tasks = [task("cpu-0", 0), task("gpu", 8), task("cpu-1", 0), task("late", 8)]
    trace = Trace([gpu_node("n1")], [], tasks, 0)
    (result,) = replay(trace, [KUBE_DEFAULT]).results
    assert (result.cpu_tasks.arrived, result.cpu_tasks.placed) == (1, 1)
    assert (result.gpu_tasks.arrived, result.gpu_tasks.placed) == (1, 1)
    assert result.tasks == 2
    assert result.unallocated_gpu_pct == 0.0


def test_unschedulable_tasks_are_dropped_never_retried() -> None:
    tasks = [task("a", 8), task("b", 8), task("c", 1)]
    trace = Trace([gpu_node("n1")], [], tasks, 0)
    (result,) = replay(trace, [KUBE_DEFAULT], ReplayConfig(until_demand=500)).results
    assert (result.gpu_tasks.arrived, result.gpu_tasks.placed) == (3, 1)
    assert result.unallocated_gpu_pct == 0.0


def test_deletions_free_resources_before_later_arrivals() -> None:
    tasks = [
        task("first", 8, created=0, deleted=10),
        task("blocked", 8, created=5, deleted=50),
        task("after", 8, created=20, deleted=None),
    ]
    trace = Trace([gpu_node("n1")], [], tasks, 0)
    keep = replay_policy(trace, policy_profile(KUBE_DEFAULT), ReplayConfig(until_demand=1000))
    assert (keep.gpu_tasks.placed, keep.deleted) == (1, 0)
    free = replay_policy(
        trace, policy_profile(KUBE_DEFAULT), ReplayConfig(until_demand=1000, deletions=True)
    )
    assert (free.gpu_tasks.placed, free.deleted) == (2, 1)
    assert free.unallocated_gpu_pct == 0.0


def test_deletions_need_creation_times() -> None:
    with pytest.raises(ReplayError, match="creation times"):
        replay(small_then_whole(), [KUBE_DEFAULT], ReplayConfig(deletions=True))


def test_preplaced_pods_are_existing_load() -> None:
    holder = gpu_pod("holder", 8)
    nodes = [gpu_node("n1"), gpu_node("n2")]
    trace = Trace(nodes, [(holder, "n1")], [task("a", 8), task("b", 8)], 0)
    (result,) = replay(trace, [KUBE_MOST_ALLOCATED], ReplayConfig(until_demand=200)).results
    assert result.curve[0] == (0.0, 50.0)
    assert (result.gpu_tasks.arrived, result.gpu_tasks.placed) == (2, 1)
    assert result.unallocated_gpu_pct == 0.0


def test_every_arrival_is_shown_to_the_gpu_demand_before_its_cycle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[str] = []
    observe = GpuDemand.observe

    def spy(self: GpuDemand, pod: Pod) -> None:
        seen.append(pod.name)
        observe(self, pod)

    monkeypatch.setattr(GpuDemand, "observe", spy)
    trace = small_then_whole()
    replay(trace, [LATTICE])
    assert seen == [t.pod.name for t in trace.tasks]


def test_policies_are_the_core_profiles() -> None:
    assert policy_profile(LATTICE) is DEFAULT_PROFILE
    default, most = policy_profile(KUBE_DEFAULT), policy_profile(KUBE_MOST_ALLOCATED)
    assert (default.name, most.name) == (KUBE_DEFAULT, KUBE_MOST_ALLOCATED)
    assert default.node_resources_fit.strategy is ScoringStrategy.LEAST_ALLOCATED
    assert most.node_resources_fit.strategy is ScoringStrategy.MOST_ALLOCATED
    assert dict(most.node_resources_fit.resources) == {"cpu": 1, "memory": 1, "nvidia.com/gpu": 3}
    with pytest.raises(ValueError, match="unknown policy"):
        policy_profile("fifo")


def test_replays_are_deterministic_per_seed() -> None:
    trace = small_then_whole()
    first = replay(trace, POLICY_NAMES, ReplayConfig(seed=3))
    again = replay(trace, POLICY_NAMES, ReplayConfig(seed=3))
    assert [r.curve for r in first.results] == [r.curve for r in again.results]
    assert [r.policy for r in first.results] == list(POLICY_NAMES)


def test_json_and_table_carry_every_policy() -> None:
    run = replay(small_then_whole(), [KUBE_DEFAULT, KUBE_MOST_ALLOCATED])
    doc = run.to_json()
    assert doc["trace"] == "toy"
    assert [p["policy"] for p in doc["policies"]] == [KUBE_DEFAULT, KUBE_MOST_ALLOCATED]
    assert doc["policies"][0]["gpuTasks"] == {"arrived": 5, "placed": 4}
    assert doc["policies"][1]["unallocatedGpuPercent"] == 25.0
    assert doc["policies"][1]["curve"][-1] == [75.0, 25.0]
    table = format_table(run).splitlines()
    assert table[1].split()[:2] == ["policy", "unallocated"]
    assert table[2].split()[:5] == [KUBE_DEFAULT, "75.00", "4/5", "0/1", "0/0"]
    assert table[3].split()[:5] == [KUBE_MOST_ALLOCATED, "25.00", "5/5", "1/1", "0/0"]


def test_a_slice_of_the_real_trace_lattice_strands_least() -> None:
    full = load_alibaba(
        DATA / "openb_node_list_gpu_node.csv", DATA / "openb_pod_list_multigpu40.csv"
    )
    # Every 5th node keeps the fleet's mix of models and sizes: 243 nodes, 1257 GPUs.
    trace = Trace(full.nodes[::5], [], full.tasks, full.skipped, name="slice")
    run = replay(trace, POLICY_NAMES, ReplayConfig(until_demand=100))
    assert (run.nodes, run.gpus) == (243, 1257)
    assert run.arrived_gpus >= run.gpus
    for result in run.results:
        assert result.tasks == run.arrived
        assert 0 < result.gpu_tasks.placed <= result.gpu_tasks.arrived
        assert result.multi_gpu_tasks.placed <= result.multi_gpu_tasks.arrived
        assert result.unallocated_gpu_pct is not None
        assert 0 <= result.unallocated_gpu_pct < 100
        assert result.curve[-1] == (100.0, result.unallocated_gpu_pct)
    results = by_policy(run.results)
    lattice = results[LATTICE]
    assert lattice.unallocated_gpu_pct is not None
    for peer in (results[KUBE_DEFAULT], results[KUBE_MOST_ALLOCATED]):
        assert peer.unallocated_gpu_pct is not None
        assert lattice.unallocated_gpu_pct * 2 <= peer.unallocated_gpu_pct
        assert lattice.multi_gpu_tasks.placed >= peer.multi_gpu_tasks.placed


def test_with_wait_a_task_that_does_not_fit_waits_for_a_deletion_and_runs_its_length() -> None:
    # One 8-GPU node: "a" holds 6 GPUs from t=0 to t=100; "b" (4 GPUs) arrives at 10 and
    # fits once "a" leaves, then runs its trace length (50 s) from 100; "c" (8 GPUs)
    # arrives at 20, behind "b", and gets the node when b leaves at 150.
    tasks = [task("a", 6, 0, 100), task("b", 4, 10, 60), task("c", 8, 20, 400)]
    trace = Trace([gpu_node("n1")], [], tasks, 0)
    run = replay(trace, [KUBE_DEFAULT], ReplayConfig(deletions=True, wait=True, until_demand=1e6))
    (r,) = run.results
    assert r.waits == {6: [0.0], 4: [90.0], 8: [130.0]}
    assert r.multi_gpu_waits() == [0.0, 90.0, 130.0]  # all three ask more than one GPU
    assert r.still_waiting == {}
    assert (r.gpu_tasks.placed, r.gpu_tasks.arrived) == (3, 3)
    assert r.deleted == 2  # a, then b; c's end is never needed
    # Allocated GPUs over the arrivals, [0, 20]: a's 6 the whole time.
    assert r.allocated_gpu_pct_time == pytest.approx(100 * 6 / 8)
    assert "multi-GPU wait mean/p95 s" in format_table(run)


def test_a_task_larger_than_any_node_waits_to_the_end() -> None:
    tasks = [task("a", 6, 0, 100), task("huge", 8, 10, 60)]
    (r,) = replay(
        Trace([gpu_node("n1", gpus=4), gpu_node("n2", gpus=6)], [], tasks, 0),
        [KUBE_DEFAULT],
        ReplayConfig(deletions=True, wait=True, until_demand=1e6),
    ).results
    assert r.still_waiting == {8: 1}
    assert r.waits == {6: [0.0]}
    assert (r.multi_gpu_tasks.placed, r.multi_gpu_tasks.arrived) == (1, 2)


def test_without_wait_a_task_that_does_not_fit_fails_and_wait_needs_deletions() -> None:
    tasks = [task("a", 6, 0, 100), task("b", 4, 10, 60), task("c", 0, 200, 300)]
    (r,) = replay(
        Trace([gpu_node("n1")], [], tasks, 0), [KUBE_DEFAULT], ReplayConfig(deletions=True)
    ).results
    assert (r.gpu_tasks.placed, r.gpu_tasks.arrived) == (1, 2)
    assert r.waits == {}
    with pytest.raises(ValueError, match="wait needs deletions"):
        ReplayConfig(wait=True)

"""bench-frag: its pure parts, and one small live run of all three arms on a real plane."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lattice_dev.benchmarks import frag
from lattice_dev.devcluster.profiles import KWOK_ANNOTATION
from scheduler.sim import KUBE_DEFAULT, KUBE_MOST_ALLOCATED, LATTICE
from scheduler.sim.trace import Task, load_alibaba
from tests.sim.traces import tiny


def test_one_kube_scheduler_serves_the_default_and_most_allocated_profiles() -> None:
    default, packing = frag.kube_profiles()
    assert default == {"schedulerName": "default-scheduler"}
    assert packing["schedulerName"] == frag.SCHEDULER_NAMES[KUBE_MOST_ALLOCATED]
    (fit,) = packing["pluginConfig"]
    assert fit["name"] == "NodeResourcesFit"
    strategy = fit["args"]["scoringStrategy"]
    assert strategy["type"] == "MostAllocated"
    assert strategy["resources"] == [
        {"name": "cpu", "weight": 1},
        {"name": "memory", "weight": 1},
        {"name": "nvidia.com/gpu", "weight": 3},
    ]


def test_trace_bodies_become_kwok_nodes_and_arm_pods(tmp_path: Path) -> None:
    trace = load_alibaba(*tiny(tmp_path))
    body = trace.node_bodies[0]
    node = frag.kwok_node(body)
    assert node["metadata"]["annotations"][KWOK_ANNOTATION] == "fake"
    assert "uid" not in node["metadata"]
    assert "uid" in body["metadata"]
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    pod = frag.arm_pod(trace.tasks[0], "frag-x", "most-allocated")
    assert pod["metadata"] == {"name": "task-0", "namespace": "frag-x"}
    assert pod["spec"]["schedulerName"] == "most-allocated"
    assert pod["spec"]["containers"][0]["image"] == frag.PAUSE_IMAGE
    assert "status" not in pod
    assert trace.tasks[0].body is not None
    assert trace.tasks[0].body["spec"]["schedulerName"] == "lattice"  # the trace is untouched
    with pytest.raises(ValueError, match="no Pod body"):
        frag.arm_pod(Task(trace.tasks[0].pod), "ns", "lattice")


def test_figures_count_gpus_of_bound_tasks_only(tmp_path: Path) -> None:
    trace = load_alibaba(*tiny(tmp_path))  # tasks ask 1, 2, 0, 8, 4 GPUs; 18 GPUs
    bound = {"task-0": "node-a", "task-3": "node-a", "task-4": "node-b"}
    r = frag.figures(LATTICE, trace.tasks, bound, trace.gpus, seconds=2.0, cpu_s=0.3, unresolved=1)
    assert r.gpu_tasks == (2, 4)
    assert r.multi_gpu_tasks == (1, 3)
    assert r.unallocated_gpu_pct == pytest.approx(100 * (18 - 9) / 18)
    assert r.bound == 3
    assert r.pods_per_s == pytest.approx(1.5)
    assert r.cpu_ms_per_pod == pytest.approx(100.0)
    r.sim_unallocated_gpu_pct = 40.0
    assert r.sim_delta == pytest.approx(50.0 - 40.0)


def test_only_a_failed_podscheduled_condition_counts_as_unschedulable() -> None:
    def pod(status: str | None) -> dict[str, object]:
        conds = [] if status is None else [{"type": "PodScheduled", "status": status}]
        return {"status": {"conditions": conds}}

    assert frag.unschedulable(pod("False"))
    assert not frag.unschedulable(pod("True"))
    assert not frag.unschedulable(pod(None))
    assert not frag.unschedulable({})


def test_report_gives_ratios_against_both_kube_profiles(tmp_path: Path) -> None:
    trace = load_alibaba(*tiny(tmp_path))
    tasks = trace.tasks

    def arm(name: str, bound: dict[str, str]) -> frag.ArmResult:
        return frag.figures(name, tasks, bound, trace.gpus, seconds=1, cpu_s=0, unresolved=0)

    everything = {t.pod.name: "n" for t in tasks}  # 15 of 18 GPUs: 16.67 % left
    half = {"task-0": "n", "task-4": "n"}  # 9 of 18: 50 %
    lines = frag.report(
        trace,
        tasks,
        [arm(LATTICE, everything), arm(KUBE_DEFAULT, half), arm(KUBE_MOST_ALLOCATED, half)],
    )
    assert "lattice / kube-default: 0.33x the unallocated GPUs, +2 multi-GPU tasks bound" in lines
    assert any(line.startswith("lattice ") and "16.67" in line for line in lines)


@pytest.mark.usefixtures("control_plane")  # the binaries; the bench starts a plane of its own
def test_a_small_live_run_resolves_every_pod_in_every_arm(tmp_path: Path) -> None:
    out = tmp_path / "frag.json"
    assert (
        frag.main(["--max-nodes", "6", "--until-demand", "80", "--settle", "2", "--json", str(out)])
        == 0
    )
    results = {r["arm"]: r for r in json.loads(out.read_text())}
    assert set(results) == {LATTICE, KUBE_DEFAULT, KUBE_MOST_ALLOCATED}
    for r in results.values():
        assert r["unresolved"] == 0, r["arm"]
        assert r["pods"] > 10
        # 80 % of the GPUs asked: each arm binds some, and the figure is computed from them.
        assert 0 < r["gpu_tasks"][0] <= r["gpu_tasks"][1]
        assert 0 <= r["unallocated_gpu_pct"] < 100
        assert len(r["placements"]) == r["bound"]
        assert r["sim_unallocated_gpu_pct"] is not None

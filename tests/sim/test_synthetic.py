"""The synthetic mix: drawn from a trace, tunable multi-GPU share, deterministic per seed."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from scheduler.sim.trace import MULTI_GPU_SIZES, Trace, load_alibaba, synthetic, with_churn
from tests.sim.traces import tiny

TRACE_DIR = Path(__file__).resolve().parents[2] / "e2e" / "traces" / "alibaba-gpu-v2023"


@pytest.fixture(scope="module")
def base() -> Trace:
    return load_alibaba(
        TRACE_DIR / "openb_node_list_gpu_node.csv", TRACE_DIR / "openb_pod_list_multigpu40.csv"
    )


def multi_gpu_share(trace: Trace) -> float:
    sizes = Counter(t.gpus for t in trace.tasks)
    asked = sum(g * n for g, n in sizes.items())
    return float(1 - sizes[1] / asked)


@pytest.mark.parametrize("share", [0.0, 0.2, 0.4, 0.6, 1.0])
def test_the_multi_gpu_share_of_the_gpus_asked_follows_the_setting(
    base: Trace, share: float
) -> None:
    trace = synthetic(base, multi_share=share, seed=3)
    assert abs(multi_gpu_share(trace) - share) < 0.05
    assert {t.gpus for t in trace.tasks} <= {0, 1, *MULTI_GPU_SIZES}
    # Drawn until the tasks ask 110 % of the GPUs, not one task more.
    asked = sum(t.gpus for t in trace.tasks)
    assert asked >= 1.1 * base.gpus > asked - max(t.gpus for t in trace.tasks)


def test_same_seed_same_tasks_other_seed_other_tasks(base: Trace) -> None:
    a = synthetic(base, multi_share=0.4, seed=1)
    b = synthetic(base, multi_share=0.4, seed=1)
    c = synthetic(base, multi_share=0.4, seed=2)
    key = [(t.pod.name, t.gpus, t.pod.resources.requests["cpu"]) for t in a.tasks]
    assert key == [(t.pod.name, t.gpus, t.pod.resources.requests["cpu"]) for t in b.tasks]
    assert [t.gpus for t in a.tasks] != [t.gpus for t in c.tasks]
    assert len({t.pod.name for t in a.tasks}) == len(a.tasks)


def test_requests_are_resampled_from_the_base_tasks_of_the_same_size(base: Trace) -> None:
    shapes: dict[int, set[tuple[int, int]]] = {}
    for t in base.tasks:
        r = t.pod.resources.requests
        shapes.setdefault(t.gpus, set()).add((r["cpu"], r["memory"]))
    trace = synthetic(base, multi_share=0.5, seed=4)
    for t in trace.tasks:
        r = t.pod.resources.requests
        assert (r["cpu"], r["memory"]) in shapes[t.gpus]
        assert t.body is not None
        assert t.body["metadata"]["name"] == t.pod.name
    # CPU-only tasks keep about the base's share of the tasks.
    cpu_only = sum(1 for t in trace.tasks if t.gpus == 0) / len(trace.tasks)
    base_cpu = sum(1 for t in base.tasks if t.gpus == 0) / len(base.tasks)
    assert 0.5 * base_cpu < cpu_only < 1.5 * base_cpu


def test_the_nodes_are_the_base_trace_nodes(base: Trace) -> None:
    trace = synthetic(base, multi_share=0.4, seed=0)
    assert trace.nodes is base.nodes
    assert trace.gpus == base.gpus
    assert len(trace.node_bodies) == len(base.nodes)


def test_a_share_out_of_range_or_a_base_without_single_gpu_tasks_is_refused(
    base: Trace, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="multi_share"):
        synthetic(base, multi_share=1.5, seed=0)
    tiny_trace = load_alibaba(*tiny(tmp_path))
    no_singles = Trace(tiny_trace.nodes, [], [t for t in tiny_trace.tasks if t.gpus != 1], 0)
    with pytest.raises(ValueError, match="1-GPU"):
        synthetic(no_singles, multi_share=0.4, seed=0)


def test_churn_times_give_the_offered_load_asked_and_repeat_cycles_the_tasks(base: Trace) -> None:
    durations = [60.0, 600.0, 3600.0, 10**6]  # the long tail is clipped at p95
    churned = with_churn(base, durations, load=1.2, seed=5, repeat=2)
    assert len(churned.tasks) == 2 * len(base.tasks)
    assert churned.tasks[len(base.tasks)].pod.name == f"{base.tasks[0].pod.name}-r1"
    assert len({t.pod.key for t in churned.tasks}) == len(churned.tasks)
    starts = [t.created or 0.0 for t in churned.tasks]
    ends = [t.deleted or 0.0 for t in churned.tasks]
    assert all(t.created is not None and t.deleted is not None for t in churned.tasks)
    assert starts == sorted(starts)
    gpu_seconds = sum(t.gpus * (e - s) for t, s, e in zip(churned.tasks, starts, ends, strict=True))
    span = starts[-1] - starts[0]
    assert gpu_seconds / (base.gpus * span) == pytest.approx(1.2, rel=0.1)
    again = with_churn(base, durations, load=1.2, seed=5, repeat=2)
    assert [t.created for t in again.tasks] == starts
    with pytest.raises(ValueError, match="load > 0"):
        with_churn(base, durations, load=0, seed=5)

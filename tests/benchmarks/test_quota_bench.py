"""The pure pieces of `just bench-quota`: the stream plan, the summary of samples, the
report, the quota objects, and the stream's reading of its pods' events (no cluster)."""

from __future__ import annotations

import asyncio
import time
from fractions import Fraction
from typing import Any

import pytest

from lattice_dev.benchmarks.quota import (
    SIZES,
    Arrival,
    PodState,
    Sample,
    Simulated,
    Stream,
    evictions_line,
    format_report,
    plan,
    pod_body,
    quota_body,
    reclaim_rule,
    simulated,
    summarize,
)
from scheduler.core.fairshare import parse_weight
from scheduler.sim.tenants import DEFAULT_TENANTS, Tenant, parse_tenant

A = Tenant("a", 4, 6, Fraction(1), 0.5)
B = Tenant("b", 4, None, Fraction(1), 0.5)


def sample(
    at: float,
    used: tuple[int, int],
    waiting: tuple[tuple[int, ...], tuple[int, ...]],
    status: dict[str, int] | None = None,
) -> Sample:
    return Sample(
        at, {"a": used[0], "b": used[1]}, {"a": waiting[0], "b": waiting[1]}, status or {}
    )


def test_plan_is_seeded_ordered_windowed_and_offers_its_load() -> None:
    tenants = [parse_tenant(t, 64) for t in DEFAULT_TENANTS]
    arrivals = plan(tenants, 64, 2000.0, 20.0, seed=3)
    assert arrivals == plan(tenants, 64, 2000.0, 20.0, seed=3)
    assert arrivals != plan(tenants, 64, 2000.0, 20.0, seed=4)
    assert [a.at for a in arrivals] == sorted(a.at for a in arrivals)
    assert {a.gpus for a in arrivals} <= set(SIZES)
    assert all(0 < a.run <= 80.0 for a in arrivals)
    late = [a.at for a in arrivals if a.tenant == "c"]
    assert min(late) >= 0.4 * 2000
    assert max(late) < 0.8 * 2000
    # GPU-seconds offered over the windows: load x 64 GPUs each (less the clipped tail of
    # run times; summed over the tenants, as the smallest offers only ~130 pods).
    offered = sum(a.gpus * a.run for a in arrivals)
    assert offered == pytest.approx(
        sum(t.load * 64 * (t.end - t.start) * 2000 for t in tenants), rel=0.1
    )


def test_summary_integrates_samples_with_the_simulators_figures() -> None:
    samples = [
        sample(0.0, (2, 6), ((2,), ())),  # a owed its min: 2 < 4 and a pod of 2 fits under it
        sample(2.0, (4, 4), ((), ())),
        sample(4.0, (4, 4), ((), (1,)), {"a": 7}),  # status.used above a's max of 6
    ]
    got = summarize([A, B], 8, samples)
    a, b = got.figures["a"], got.figures["b"]
    assert got.span == 4.0
    # Fair shares: 4 and 4 throughout (mins, nothing left over in a pool of 8).
    assert (a.used_area, a.fair_area, a.deviation_area) == (12.0, 16.0, 4.0)
    assert (b.used_area, b.fair_area, b.deviation_area) == (20.0, 16.0, 4.0)
    assert a.deviation_pct == b.deviation_pct == 25.0
    assert (a.owed, a.still_owed, b.owed) == ([2.0], 0, [])
    assert got.above_max == {"a": 0, "b": 0}
    assert got.status_above_max == {"a": 1, "b": 0}
    assert (a.still_waiting, b.still_waiting) == (0, 1)


def test_summary_counts_samples_above_max_and_open_episodes() -> None:
    samples = [sample(0.0, (7, 0), ((), ())), sample(1.0, (0, 0), ((4,), ()))]
    got = summarize([A, B], 8, samples)
    assert got.above_max == {"a": 1, "b": 0}
    assert got.figures["a"].still_owed == 1
    assert summarize([A, B], 8, []).span == 0.0


def test_report_has_a_row_per_tenant_windows_and_flags_max() -> None:
    samples = [sample(float(t), (4, 4), ((), ())) for t in range(11)]
    text = format_report([A, B], 8, samples, windows=2, reclaimed={"b": 3}, preempted={})
    lines = text.splitlines()
    row_b = next(ln for ln in lines if ln.startswith("b "))
    assert row_b.split()[:7] == ["b", "4", "-", "1", "4.0", "4.0", "4.0"]
    assert row_b.split()[12] == "3"  # reclaimed
    assert sum(1 for ln in lines if ln.strip().startswith(("0-", "5-"))) == 2
    assert "ABOVE MAX" not in text
    over = [sample(0.0, (7, 0), ((), ())), sample(1.0, (4, 0), ((), ()))]
    assert "ABOVE MAX in 1 samples" in format_report(
        [A, B], 8, over, windows=0, reclaimed={}, preempted={}
    )


def test_quota_and_pod_bodies() -> None:
    body = quota_body(Tenant("t", 3, None, Fraction(1, 2), 0.1))
    assert body["spec"] == {"min": {"nvidia.com/gpu": "3"}}
    assert parse_weight(body["metadata"]["annotations"]) == Fraction(1, 2)
    assert quota_body(A)["spec"]["max"] == {"nvidia.com/gpu": "6"}
    pod = pod_body("a-1", "a", 4)
    assert pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "4"
    assert pod["spec"]["schedulerName"] == "lattice"


class _Core:
    def __init__(self) -> None:
        self.deleted: list[tuple[str, str]] = []

    async def delete_namespaced_pod(self, name: str, ns: str, **_: Any) -> None:
        self.deleted.append((ns, name))


async def test_stream_deletes_completed_pods_and_recreates_evicted_ones() -> None:
    stream = Stream.__new__(Stream)
    core = _Core()
    created: list[tuple[str, str, int, float]] = []

    async def create(name: str, tenant: str, gpus: int, run: float) -> None:
        created.append((name, tenant, gpus, run))

    stream.core = core  # type: ignore[assignment]
    stream.tenants = [A, B]
    stream.pods = {("a", "a-1"): PodState("a", 2, 0.0), ("b", "b-2"): PodState("b", 4, 60.0)}
    stream.evicted = {"a": 0, "b": 0}
    stream.tasks = set()
    stream.t0 = time.monotonic()
    stream.create = create  # type: ignore[method-assign]

    def obj(ns: str, name: str, node: str = "") -> dict[str, Any]:
        return {"metadata": {"namespace": ns, "name": name}, "spec": {"nodeName": node}}

    stream._seen("MODIFIED", obj("a", "a-1", "gpu-0"))
    stream._seen("MODIFIED", obj("b", "b-2", "gpu-1"))
    await asyncio.sleep(0.05)
    assert core.deleted == [("a", "a-1")]  # ran its 0 s; b-2 runs 60 s
    stream._seen("DELETED", obj("a", "a-1", "gpu-0"))  # our own deletion: no eviction
    stream._seen("DELETED", obj("b", "b-2", "gpu-1"))  # someone else's: evicted
    await asyncio.sleep(0.05)
    assert stream.evicted == {"a": 0, "b": 1}
    assert created == [("b-2.1", "b", 4, 60.0)]
    sampled = {k: v.gone for k, v in stream.pods.items()}
    assert sampled == {("a", "a-1"): True, ("b", "b-2"): True}
    # The timeline --keep writes: seen bound, then gone; only a-1 completed.
    for state in stream.pods.values():
        assert state.bound is not None
        assert state.ended is not None
        assert state.created <= state.bound <= state.ended
    assert [s.completing for s in stream.pods.values()] == [True, False]
    for task in list(stream.tasks):
        task.cancel()


def test_the_simulator_runs_the_same_stream_on_the_same_nodes() -> None:
    """The ``sim`` column: the bench's stream through the simulator's fair policy, on as
    many gpu-8x nodes. x borrows y's min on one node until y comes at 5 s."""
    x = Tenant("x", 4, None, Fraction(1), 0.5)
    y = Tenant("y", 4, None, Fraction(1), 0.5)
    # Two pods of 4: reclaim takes one back at once, x keeps its min; both at their share.
    halves = [Arrival(0.0, "x", 4, 20.0), Arrival(0.0, "x", 4, 20.0), Arrival(5.0, "y", 4, 5.0)]
    got = simulated([x, y], 1, halves, 20.0, 0.0, seed=1)
    assert got.deviation == {"x": 0.0, "y": 0.0}
    # one reclaim, one eviction, and one was the fewest it could take
    assert (got.reclaims, got.evictions, got.eviction_bound) == (1, 1, 1)
    # One pod of 8: the simulator never takes a borrower below its min, so y waits to the
    # end: x holds 8 against a share of 4 from 5 s (60 of 100 GPU-s), y none of its 4.
    whole = [Arrival(0.0, "x", 8, 20.0), Arrival(5.0, "y", 4, 5.0)]
    got = simulated([x, y], 1, whole, 20.0, 0.0, seed=1)
    assert got.deviation == {"x": 60.0, "y": 100.0}
    assert (got.reclaims, got.evictions) == (0, 0)
    # After the warm-up y has asked for nothing: no figure.
    assert simulated([x, y], 1, halves, 20.0, 10.0, seed=1).deviation["y"] is None


def test_reclaim_evictions_are_told_apart_by_rule_and_set_beside_the_simulator() -> None:
    """The live count by rule, read from the ``Preempted`` Events' messages (the format
    :func:`scheduler.core.reclaim.reclaimed` writes), and the line that sets the min rule's
    beside the simulator's count and lower bound."""
    base = "Reclaimed by ElasticQuota a/q for pod a/p-1 on node gpu-001: quota b/q "
    assert reclaim_rule(base + "used more than its min") == "min"
    assert reclaim_rule(base + "was above its fair share") == "fair share"
    assert reclaim_rule("Preempted by pod 1234 on node gpu-001") is None
    line = evictions_line({"min": 7, "fair share": 3}, Simulated({}, 5, 4, 4))
    assert line == (
        "reclaim evictions: live 10 (min rule 7, fair-share rule 3); the same stream in the "
        "simulator (min rule only, no delays): 5 in 4 reclaims, per-reclaim lower bound 4"
    )

"""Tenants under quotas: the stream, the three policies' rules, the figures, the command."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from scheduler.cli import main
from scheduler.model.pod import Pod
from scheduler.sim.tenants import (
    CAPACITY,
    FAIR,
    NONE,
    PolicyRun,
    Tenant,
    TenantError,
    parse_tenant,
    simulate,
    simulate_policy,
    tenant_stream,
)
from scheduler.sim.trace import Task, Trace, pod_body
from tests.sim.traces import (
    DEFAULT_HEADER,
    MULTIGPU_HEADER,
    NODES_HEADER,
    gpu_node,
    write_csv,
)

RUNS = [100.0 * (k % 10 + 1) for k in range(40)]
"""Run times 100..1000 s (mean 550)."""


def _cluster(nodes: int = 4, sizes: tuple[int, ...] = (1, 2, 4, 1, 1, 2)) -> Trace:
    tasks = []
    for i, g in enumerate(sizes):
        body = pod_body(f"shape-{i}", uid=f"shape-{i}", cpu_milli=1000, memory_mib=1024, gpus=g)
        tasks.append(Task(Pod.from_api(body), body=body))
    return Trace([gpu_node(f"n{i}") for i in range(nodes)], [], tasks, 0, name="toy")


# --- tenant specifications


def test_tenant_specs_parse() -> None:
    t = parse_tenant("a:25%:-:2:0.5:0.25-0.75", 40)
    assert t == Tenant("a", 10, None, Fraction(2), 0.5, 0.25, 0.75)
    assert parse_tenant("b:4:8:0.5:1", 40) == Tenant("b", 4, 8, Fraction(1, 2), 1.0)


@pytest.mark.parametrize(
    "spec",
    [
        "a:1:2:1",
        ":1:2:1:1",
        "a:x:2:1:1",
        "a:4:2:1:1",
        "a:1:2:0:1",
        "a:1:2:1:0",
        "a:1:2:1:1:0.5-0.2",
    ],
)
def test_bad_tenant_specs_are_refused(spec: str) -> None:
    with pytest.raises(TenantError):
        parse_tenant(spec, 32)


# --- the stream


def test_streams_are_seeded_windowed_and_namespaced() -> None:
    trace = _cluster()
    tenants = [parse_tenant("a:8:-:1:0.5", 32), parse_tenant("b:8:-:1:0.5:0.5-1", 32)]
    jobs, horizon = tenant_stream(trace, tenants, RUNS, horizon_runs=6, seed=3)
    again, _ = tenant_stream(trace, tenants, RUNS, horizon_runs=6, seed=3)
    other, _ = tenant_stream(trace, tenants, RUNS, horizon_runs=6, seed=4)
    assert [(j.tenant, j.created, j.gpus) for j in jobs] == [
        (j.tenant, j.created, j.gpus) for j in again
    ]
    assert [j.created for j in jobs] != [j.created for j in other]
    assert horizon == pytest.approx(6 * 550)
    assert all(j.pod.namespace == j.tenant for j in jobs)
    assert all(j.created >= horizon / 2 for j in jobs if j.tenant == "b")
    assert [j.created for j in jobs] == sorted(j.created for j in jobs)
    assert {j.tenant for j in jobs} == {"a", "b"}


# --- the policies


def _run(policy: str, tenants: list[str], *, seed: int = 1, horizon: float = 8) -> PolicyRun:
    trace = _cluster()
    parsed = [parse_tenant(t, trace.gpus) for t in tenants]
    jobs, h = tenant_stream(trace, parsed, RUNS, horizon_runs=horizon, seed=seed)
    return simulate_policy(trace, parsed, jobs, h, policy, warmup=h / 6, seed=seed)


LATE = ["a:12:32:1:0.8", "b:12:24:1:0.6", "c:8:-:1:0.4:0.4-0.9"]
"""32 GPUs, mins add up to them; a and b overload it, c arrives late and must reclaim."""


def test_quota_policies_keep_max_and_reclaim_for_the_late_tenant() -> None:
    for policy in (CAPACITY, FAIR):
        run = _run(policy, LATE)
        assert all(f.above_max_s == 0 for f in run.tenants.values()), policy
        assert run.evictions > 0, policy
        assert run.evictions >= run.eviction_bound, policy
        assert run.reclaims <= run.evictions, policy
        assert run.tenants["c"].evicted < run.evictions, policy  # c takes more than it loses
        assert run.tenants["c"].still_owed == 0, policy  # c is never left below its min
        assert sum(f.evicted for f in run.tenants.values()) == run.evictions


def test_no_quota_never_evicts_and_lets_a_tenant_past_its_max() -> None:
    run = _run(NONE, ["a:12:12:1:0.8", *LATE[1:]])
    assert run.evictions == 0
    assert run.tenants["a"].above_max_s > 0


def test_fair_shares_the_leftover_by_weight() -> None:
    """Two heavy tenants borrow what a light one lends; b weighs 3: under fair it gets
    more of the leftover than under arrival order, and close to its fair share."""
    tenants = ["a:4:-:1:1.0", "b:4:-:3:1.0", "d:24:-:1:0.05"]
    capacity = _run(CAPACITY, tenants, horizon=16)
    fair = _run(FAIR, tenants, horizon=16)
    b_cap = capacity.tenants["b"]
    b_fair = fair.tenants["b"]
    a_fair = fair.tenants["a"]
    assert b_fair.used_area > b_cap.used_area
    assert b_fair.used_area > 1.5 * a_fair.used_area
    dev_fair = b_fair.deviation_pct
    dev_cap = b_cap.deviation_pct
    assert dev_fair is not None
    assert dev_cap is not None
    assert dev_fair < dev_cap


# --- the command


def _files(tmp_path: Path) -> list[str]:
    nodes = [f"n{i},64000,262144,8,V100M32" for i in range(4)]
    tasks = [f"t{n},2000,8192,{g},1000" for n, g in enumerate([1, 2, 4, 1, 8, 1, 2])]
    runs = [
        f"d{n},1000,1024,1,1000,,LS,Running,{n},{n + 100 * (n % 10 + 1)},{n}" for n in range(20)
    ]
    return [
        "--nodes",
        str(write_csv(tmp_path / "nodes.csv", NODES_HEADER, nodes)),
        "--tasks",
        str(write_csv(tmp_path / "tasks.csv", MULTIGPU_HEADER, tasks)),
        "--durations",
        str(write_csv(tmp_path / "runs.csv", DEFAULT_HEADER, runs)),
    ]


def test_the_command_prints_a_row_per_policy_and_tenant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--tenants", *_files(tmp_path), "--seeds", "1", "2", "--horizon", "6"]
    assert main([*argv, "--no-progress"]) == 0
    out = capsys.readouterr().out
    rows = [
        line.split()
        for line in out.splitlines()
        if line.split()[:1] in (["none"], ["capacity"], ["fair"])
    ]
    # 2 seeds x 3 policies x 4 default tenants, then one summary row per policy.
    assert len(rows) == 2 * 3 * 4 + 3
    assert "over seeds 1, 2:" in out
    assert main([*argv, "--no-progress", "-o", "json", "--quota-policies", "fair"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [p["policy"] for r in doc["runs"] for p in r["policies"]] == ["fair", "fair"]
    tenants = doc["runs"][0]["policies"][0]["tenants"]
    assert [t["tenant"] for t in tenants] == ["a", "b", "c", "d"]
    assert all(t["aboveMaxSeconds"] == 0 for t in tenants)


def test_the_command_refuses_what_it_cannot_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _files(tmp_path)
    assert main(["simulate", "--tenants", *files[:4], "--no-progress"]) == 2
    assert "--durations" in capsys.readouterr().err
    assert main(["simulate", "--tenants", "--gangs", *files, "--no-progress"]) == 2
    assert main(["simulate", "--tenants", "x:1", *files, "--no-progress"]) == 1
    assert "NAME:MIN:MAX" in capsys.readouterr().err
    assert main(["simulate", "--tenants", "a:1:2:1:1", "a:1:2:1:1", *files, "--no-progress"]) == 1
    assert "distinct" in capsys.readouterr().err


def test_simulate_runs_every_policy_over_one_stream() -> None:
    trace = _cluster()
    tenants = [parse_tenant(t, trace.gpus) for t in LATE]
    result = simulate(trace, tenants, RUNS, horizon_runs=4, warmup_runs=1, seed=2)
    assert [r.policy for r in result.runs] == [NONE, CAPACITY, FAIR]
    assert result.warmup == pytest.approx(result.horizon / 4)
    assert result.to_json()["tasks"] == result.jobs

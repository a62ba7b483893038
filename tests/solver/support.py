"""Builders for gang solver tests: GPU nodes, members, gangs, and checks of a plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache

import numpy as np

from scheduler.core.load import LoadView
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import IntArray, Snapshot
from scheduler.core.topology.state import TopologyState
from scheduler.model.gang import GangSpec
from scheduler.model.pod import Pod
from scheduler.model.topology import GPU_RESOURCE
from scheduler.solver import GangPlan, GangProblem, build_problem, solve, violations
from tests.builders import NodeBuilder, PodBuilder, make_node, make_pod


@cache
def framework() -> Framework:
    return Framework()


def gpu_node(name: str, gpus: int, *, cpu: str = "32", memory: str = "128Gi") -> NodeBuilder:
    return make_node(name, cpu=cpu, memory=memory).resource(GPU_RESOURCE, gpus)


def member(
    name: str, gpus: int = 0, *, cpu: str = "1", memory: str = "1Gi", app: str = "train"
) -> PodBuilder:
    resources = {GPU_RESOURCE: str(gpus)} if gpus else None
    return make_pod(name, cpu=cpu, memory=memory, resources=resources).label("app", app)


def gang(
    *,
    min_member: int = 1,
    topology_key: str | None = None,
    min_resources: Mapping[str, int] | None = None,
    preferred: str | None = None,
    slice_size: int | None = None,
    slice_key: str | None = None,
) -> GangSpec:
    return GangSpec(
        namespace="default",
        name="g",
        min_member=min_member,
        topology_key=topology_key,
        topology_preferred=preferred,
        slice_size=slice_size,
        slice_key=slice_key,
        min_resources=dict(min_resources or {}),
    )


def built(members: Sequence[PodBuilder | Pod]) -> list[Pod]:
    return [m.build() if isinstance(m, PodBuilder) else m for m in members]


def problem_for(
    snapshot: Snapshot,
    members: Sequence[PodBuilder | Pod],
    *,
    need: int | None = None,
    spec: GangSpec | None = None,
    topology: TopologyState | None = None,
    load: LoadView | None = None,
    fw: Framework | None = None,
    merge: bool = True,
    levels: Sequence[str] = (),
    slice_bound: Sequence[tuple[str, int]] = (),
) -> GangProblem:
    pods = built(members)
    return build_problem(
        fw or framework(),
        snapshot,
        spec or gang(min_member=len(pods)),
        pods,
        need=len(pods) if need is None else need,
        topology=topology,
        load=load,
        merge=merge,
        levels=levels,
        slice_bound=slice_bound,
    )


def counts_of(problem: GangProblem, plan: GangPlan) -> IntArray:
    index = {name: n for n, name in enumerate(problem.node_names)}
    counts = np.zeros((problem.num_classes, problem.num_nodes), dtype=np.int64)
    for i, node in plan.placements:
        counts[problem.member_class[i], index[node]] += 1
    return counts


def assert_valid(
    snapshot: Snapshot, members: Sequence[Pod], problem: GangProblem, plan: GangPlan
) -> None:
    """The plan breaks no model rule and, checked against the snapshot itself, fits."""
    assert violations(problem, counts_of(problem, plan)) == []
    assert len({i for i, _ in plan.placements}) == len(plan.placements)
    used: dict[tuple[str, str], int] = {}
    pods: dict[str, int] = {}
    for i, node in plan.placements:
        pods[node] = pods.get(node, 0) + 1
        for resource, amount in members[i].resources.requests.items():
            used[(node, resource)] = used.get((node, resource), 0) + amount
    for (node, resource), amount in used.items():
        row = snapshot.index_of(node)
        col = snapshot.resource_column(resource)
        assert row is not None
        assert col is not None
        free = snapshot.allocatable[col][row] - snapshot.requested[col][row]
        assert amount <= free, f"{node}: {amount} {resource} placed, {free} free"
    for node, count in pods.items():
        row = snapshot.index_of(node)
        assert row is not None
        assert count <= snapshot.allowed_pods[row] - snapshot.pod_counts[row]


def plan_for(
    snapshot: Snapshot,
    members: Sequence[PodBuilder | Pod],
    *,
    need: int | None = None,
    spec: GangSpec | None = None,
    topology: TopologyState | None = None,
    time_limit_s: float = 10.0,
    use_solver: bool = True,
    seed: int = 0,
    fw: Framework | None = None,
    levels: Sequence[str] = (),
) -> tuple[GangProblem, GangPlan]:
    """Build, solve with a generous limit (tests must not depend on speed), validate."""
    pods = built(members)
    problem = problem_for(
        snapshot, pods, need=need, spec=spec, topology=topology, fw=fw, levels=levels
    )
    plan = solve(problem, time_limit_s=time_limit_s, use_solver=use_solver, seed=seed)
    assert_valid(snapshot, pods, problem, plan)
    return problem, plan


def replay(
    snapshot: Snapshot,
    members: Sequence[Pod],
    placements: GangPlan | Sequence[tuple[int, str]],
    fw: Framework | None = None,
) -> list[str]:
    """The commit's re-check without a cache: each member in ``placements`` order must
    find its planned node feasible (every filter, the members before it placed). Returns the
    members that did not, with the framework's summary; the snapshot is left as it was."""
    fw = fw or framework()
    failures: list[str] = []
    placed: list[Pod] = []
    try:
        steps = placements.placements if isinstance(placements, GangPlan) else placements
        for i, node in steps:
            pod = members[i]
            decision = fw.schedule(snapshot, pod, restrict_to=frozenset({node}))
            if decision.selected != node:
                failures.append(f"{pod.name} on {node}: {decision.summary}")
            snapshot.add_pod(pod, node)
            placed.append(pod)
    finally:
        for pod in placed:
            snapshot.remove_pod(pod)
    return failures

"""Gang plans against two references on random small cases.

Random small clusters (a few node shapes repeated: GPUs, zones, a taint, placed load) and
gangs (a few member shapes, an unread per-member index label, optional anti-affinity,
affinity group, spread and one-domain key).

* The brute-force reference (:mod:`tests.solver.reference`) reads only the raw nodes and
  pods, never the built problem: the plan must break none of its rules, place as many
  members as its exhaustive search does, and commit member by member through the
  framework in the plan's order. Mistakes in classes, limits or joint rules show here.
* The naive model (one boolean per member and node, no merging, no domain split) solves
  the unmerged problem: same admission and optimal objective as the count model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from lattice_dev.solver.naive import solve_naive
from scheduler.model.names import LABEL_HOSTNAME
from scheduler.model.pod import Pod
from scheduler.model.topology import GPU_RESOURCE
from scheduler.solver import SolveStatus, objective, solve, violations
from scheduler.solver.model import ModelStatus
from tests.builders import NodeBuilder, PodBuilder, cluster, make_pod
from tests.solver.reference import Reference
from tests.solver.support import (
    assert_valid,
    framework,
    gang,
    gpu_node,
    member,
    problem_for,
    replay,
)

Case = tuple[list[NodeBuilder], list[tuple[PodBuilder, str]], list[Pod], int, str | None]
"""Nodes, placed pods, members, need, the gang's topology key."""


@dataclass(frozen=True)
class Shape:
    gpus: int
    cpu: str
    anti: str
    """Required anti-affinity per hostname with members of its own role, of team x, or none."""
    spread: bool
    tolerates: bool
    affinity: bool


shapes = st.builds(
    Shape,
    gpus=st.sampled_from([0, 1, 2, 4]),
    cpu=st.sampled_from(["500m", "2", "6"]),
    anti=st.sampled_from(["", "role", "team"]),
    spread=st.booleans(),
    tolerates=st.booleans(),
    affinity=st.integers(0, 3).map(lambda i: i == 0),
)


@dataclass(frozen=True)
class NodeShape:
    gpus: int
    cpu: str
    zone: str | None
    tainted: bool
    used_gpus: int
    load_cpu: str | None


@st.composite
def node_shapes(draw: st.DrawFn) -> NodeShape:
    gpus = draw(st.sampled_from([0, 2, 4, 8, 8, 8]))
    return NodeShape(
        gpus=gpus,
        cpu=draw(st.sampled_from(["4", "8", "16"])),
        zone=draw(st.sampled_from([None, "a", "b", "a", "b"])),
        tainted=draw(st.integers(0, 7)) == 0,
        used_gpus=draw(st.integers(0, gpus // 2)),
        load_cpu=draw(st.sampled_from([None, "500m", "2"])),
    )


@st.composite
def cases(draw: st.DrawFn, max_nodes: int = 7, max_members: int = 5) -> Case:
    # Nodes repeat a few shapes, so interchangeable nodes (which the model drops) occur.
    kinds_of_nodes = draw(st.lists(node_shapes(), min_size=1, max_size=3))
    n_nodes = draw(st.integers(1, max_nodes))
    nodes: list[NodeBuilder] = []
    placed: list[tuple[PodBuilder, str]] = []
    for i in range(n_nodes):
        shape = kinds_of_nodes[draw(st.integers(0, len(kinds_of_nodes) - 1))]
        node = gpu_node(f"n{i}", shape.gpus, cpu=shape.cpu)
        if shape.zone is not None:
            node.label("zone", shape.zone)
        if shape.tainted:
            node.taint("dedicated", "x")
        nodes.append(node)
        if shape.used_gpus or shape.load_cpu is not None:
            resources = {GPU_RESOURCE: str(shape.used_gpus)} if shape.used_gpus else None
            load = make_pod(f"load-{i}", cpu=shape.load_cpu or "100m", resources=resources)
            placed.append((load.label("app", "other"), f"n{i}"))
    kinds = draw(st.lists(shapes, min_size=1, max_size=3))
    twin = len(kinds) if len(kinds) < 3 and draw(st.booleans()) else None
    if twin is not None:
        kinds.append(kinds[0])  # told apart only by its labels: team y and its role
    n_members = draw(st.integers(1, max_members))
    members: list[Pod] = []
    for i in range(n_members):
        k = draw(st.integers(0, len(kinds) - 1))
        kind = kinds[k]
        pod = member(f"m{i}", kind.gpus, cpu=kind.cpu).label("index", str(i))
        role = f"r{k}"
        pod.label("role", role).label("team", "y" if k == twin else "x")
        if kind.anti:
            selector = {"role": role} if kind.anti == "role" else {"team": "x"}
            pod.pod_anti_affinity(LABEL_HOSTNAME, selector)
        if kind.spread:
            pod.spread(1, "zone", {"app": "train"})
        if kind.affinity:
            pod.pod_affinity("zone", {"app": "train"})  # members starting their group
        if kind.tolerates:
            pod.toleration("dedicated", "x", "NoSchedule")
        members.append(pod.build())
    need = draw(st.integers(1, n_members))
    key = draw(st.sampled_from([None, "zone"]))
    return nodes, placed, members, need, key


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(cases())
def test_plans_hold_against_the_raw_reference_and_the_naive_model(case: Case) -> None:
    nodes, placed, members, need, key = case
    snapshot = cluster(nodes, placed)
    spec = gang(min_member=need, topology_key=key)
    merged = problem_for(snapshot, members, need=need, spec=spec)
    unmerged = problem_for(snapshot, members, need=need, spec=spec, merge=False)
    assert merged.weights == unmerged.weights

    plan = solve(merged, time_limit_s=30.0, workers=1)
    event(f"status {plan.status.value}, {plan.placed} placed")
    event(f"{merged.num_classes} of {unmerged.num_classes} classes")
    for name, rules in (
        ("anti", merged.anti),
        ("spread", merged.spreads),
        ("affinity", merged.together),
    ):
        if rules:
            event(f"with {name}")
    assert plan.status in (SolveStatus.OPTIMAL, SolveStatus.INFEASIBLE)
    assert_valid(snapshot, members, merged, plan)

    # Independent of the built problem: the raw rules, an exhaustive count, the commit.
    raw = Reference.of(
        framework(),
        snapshot,
        [n.build() for n in nodes],
        [(p.build(), n) for p, n in placed],
        members,
        key,
    )
    assignment: list[str | None] = [None] * len(members)
    for i, node in plan.placements:
        assignment[i] = node
    if plan.admitted:
        assert raw.violations(assignment) == []
        assert replay(snapshot, members, plan) == []
    most = raw.most_placed()
    assert plan.admitted == (most >= need)
    assert plan.placed == most

    naive = solve_naive(unmerged, time_limit_s=30.0, workers=1)
    assert naive.status is ModelStatus.OPTIMAL
    assert naive.counts is not None
    assert violations(unmerged, naive.counts) == []
    assert plan.admitted == (naive.counts.sum() >= need)
    assert plan.objective == naive.objective

    # The naive answer, read back into merged classes, is valid there and scores the same.
    back = np.zeros_like(merged.limit)
    index = {name: n for n, name in enumerate(merged.node_names)}
    for c, n in zip(*np.nonzero(naive.counts), strict=True):
        member_index = unmerged.classes[c].members[0]
        back[merged.member_class[member_index], index[unmerged.node_names[n]]] += naive.counts[c, n]
    assert violations(merged, back) == []
    assert objective(merged, back) == naive.objective

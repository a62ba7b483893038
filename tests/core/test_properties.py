"""Property tests: what the vectorised cycle reports must agree with a per-node reading of
kube-scheduler's rules, and every feasible node must really fit the pod."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.schedule import schedule
from scheduler.model.node import Node
from scheduler.model.pod import Pod, tolerates
from tests.builders import cluster, make_node, make_pod

TAINTS = [
    ("gpu", "true", "NoSchedule"),
    ("spot", "", "NoExecute"),
    ("soft", "x", "PreferNoSchedule"),
]
TOLERATIONS = [
    {"key": "gpu", "value": "true", "effect": "NoSchedule"},
    {"key": "spot", "operator": "Exists"},
    {"operator": "Exists"},
    {"key": "gpu", "value": "false"},
]


@st.composite
def scenarios(draw: Any) -> tuple[list[Node], list[tuple[Pod, str]], Pod]:
    num_nodes = draw(st.integers(1, 8))
    nodes = []
    for i in range(num_nodes):
        builder = make_node(
            f"n{i}",
            cpu=f"{draw(st.integers(0, 4000))}m",
            memory=str(draw(st.integers(0, 8)) * 1024**3),
            pods=draw(st.integers(0, 4)),
        )
        zone = draw(st.sampled_from(["a", "b", None]))
        if zone:
            builder.label("zone", zone)
        for key, value, effect in draw(st.lists(st.sampled_from(TAINTS), max_size=2, unique=True)):
            builder.taint(key, value, effect)
        if draw(st.integers(0, 9)) == 0:
            builder.unschedulable()
        if draw(st.booleans()):
            builder.resource("example.com/dev", str(draw(st.integers(0, 2))))
        nodes.append(builder.build())
    placed = []
    for j in range(draw(st.integers(0, 10))):
        pod = make_pod(
            f"e{j}",
            cpu=f"{draw(st.integers(0, 2000))}m",
            memory=str(draw(st.integers(0, 3)) * 1024**3),
        ).build()
        placed.append((pod, f"n{draw(st.integers(0, num_nodes - 1))}"))
    incoming = make_pod(
        "p",
        cpu=f"{draw(st.integers(0, 3000))}m",
        memory=str(draw(st.integers(0, 4)) * 1024**3),
        resources={"example.com/dev": "1"} if draw(st.booleans()) else None,
    )
    if draw(st.booleans()):
        incoming.node_selector({"zone": draw(st.sampled_from(["a", "b"]))})
    for toleration in draw(st.lists(st.sampled_from(TOLERATIONS), max_size=2)):
        incoming.toleration(
            toleration.get("key", ""),
            toleration.get("value", ""),
            toleration.get("effect", ""),
            toleration.get("operator", "Equal"),
        )
    return nodes, placed, incoming.build()


def reference_reasons(node: Node, pods: list[Pod], pod: Pod) -> tuple[str, ...]:
    """kube-scheduler's default filters for one node, first failing plugin only."""
    if node.unschedulable and not any(
        t.key in ("", "node.kubernetes.io/unschedulable")
        and t.effect in ("", "NoSchedule")
        and (t.operator == "Exists" or t.value == "")
        for t in pod.tolerations
    ):
        return ("node(s) were unschedulable",)
    if any(t.blocks_scheduling and not tolerates(pod.tolerations, t) for t in node.taints):
        return ("node(s) had untolerated taint(s)",)
    if pod.node_selector is not None and any(
        node.labels.get(k) != v for k, v in pod.node_selector.items()
    ):
        return ("node(s) didn't match Pod's node affinity/selector",)
    out = []
    if len(pods) + 1 > node.allocatable.get("pods", 0):
        out.append("Too many pods")
    for resource in ("cpu", "memory", "example.com/dev"):
        want = pod.resources.requests.get(resource, 0)
        used = sum(p.resources.accounted.get(resource, 0) for p in pods)
        if want > 0 and want > node.allocatable.get(resource, 0) - used:
            out.append(f"Insufficient {resource}")
    return tuple(out)


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_vectorised_filters_agree_with_per_node_reference(
    scenario: tuple[list[Node], list[tuple[Pod, str]], Pod],
) -> None:
    nodes, placed, pod = scenario
    decision = schedule(cluster(nodes, placed), pod)
    explanation = decision.explanation
    for node in nodes:
        pods_here = [p for p, n in placed if n == node.name]
        expected = reference_reasons(node, pods_here, pod)
        assert explanation.node(node.name).reasons == expected, node
    assert (decision.selected is None) == (decision.feasible == ())
    assert decision.selected is None or decision.selected in decision.feasible


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_feasible_implies_fits(scenario: tuple[list[Node], list[tuple[Pod, str]], Pod]) -> None:
    nodes, placed, pod = scenario
    decision = schedule(cluster(nodes, placed), pod)
    by_name = {n.name: n for n in nodes}
    for name in decision.feasible:
        node = by_name[name]
        pods_here = [p for p, n in placed if n == name]
        for resource, amount in pod.resources.requests.items():
            if amount == 0:
                continue  # kube-scheduler does not check zero requests (nodes may be overcommitted)
            used = sum(p.resources.accounted.get(resource, 0) for p in pods_here)
            assert used + amount <= node.allocatable.get(resource, 0)
        assert len(pods_here) + 1 <= node.allocatable.get("pods", 0)
        if pod.node_selector:
            assert all(node.labels.get(k) == v for k, v in pod.node_selector.items())
        for taint in node.taints:
            if taint.blocks_scheduling:
                assert tolerates(pod.tolerations, taint)
    counted = sum(decision.reason_counts().values())
    assert counted >= len(nodes) - len(decision.feasible)

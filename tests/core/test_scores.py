"""Resource scores (LeastAllocated, MostAllocated, BalancedAllocation) and TaintToleration
scoring, with cases after least_allocated_test.go, most_allocated_test.go,
balanced_allocation_test.go and taint_toleration_test.go."""

from __future__ import annotations

import pytest

from scheduler.core.profile import (
    BALANCED_ALLOCATION,
    NODE_RESOURCES_FIT,
    TAINT_TOLERATION,
    NodeResourcesFitArgs,
    Profile,
    ScoringStrategy,
)
from scheduler.core.schedule import Framework
from tests.builders import NodeBuilder, PodBuilder, make_node, make_pod
from tests.core.support import only_score, run, scores


def nodes(*sizes: tuple[str, str]) -> list[NodeBuilder]:
    return [make_node(f"node{i + 1}", cpu=c, memory=m) for i, (c, m) in enumerate(sizes)]


def requested(cpu: str, memory: str) -> PodBuilder:
    return make_pod("p", cpu=cpu, memory=memory)


def fit_framework(
    strategy: ScoringStrategy = ScoringStrategy.LEAST_ALLOCATED,
    resources: tuple[tuple[str, int], ...] = (("cpu", 1), ("memory", 1)),
) -> Framework:
    args = NodeResourcesFitArgs(strategy=strategy, resources=resources)
    return Framework(
        Profile(name="fit", filters=(), scores=((NODE_RESOURCES_FIT, 1),), node_resources_fit=args)
    )


SPLIT_POD = make_pod("p").container("1000", "2000").container("2000", "3000")


@pytest.mark.parametrize(
    ("pod", "cluster_nodes", "existing", "expected"),
    [
        pytest.param(
            SPLIT_POD,
            nodes(("4000", "10000"), ("6000", "10000")),
            [],
            {"node1": 37, "node2": 50},
            id="nothing-scheduled-differently-sized-nodes",
        ),
        pytest.param(
            SPLIT_POD,
            nodes(("10000", "20000"), ("10000", "20000")),
            [(requested("3000", "0"), "node1"), (requested("3000", "5000"), "node2")],
            {"node1": 57, "node2": 45},
            id="pods-scheduled-with-resources",
        ),
        pytest.param(
            SPLIT_POD,
            nodes(("10000", "20000"), ("10000", "50000")),
            [(requested("3000", "0"), "node1"), (requested("3000", "5000"), "node2")],
            {"node1": 57, "node2": 60},
            id="pods-scheduled-differently-sized-nodes",
        ),
        pytest.param(
            requested("3000", "0"),
            nodes(("4000", "10000"), ("4000", "10000")),
            [(requested("3000", "0"), "node1"), (requested("3000", "5000"), "node2")],
            {"node1": 50, "node2": 25},
            id="requests-exceed-capacity-score-zero",
        ),
    ],
)
def test_least_allocated(
    pod: PodBuilder,
    cluster_nodes: list[NodeBuilder],
    existing: list[tuple[PodBuilder, str]],
    expected: dict[str, int],
) -> None:
    decision = run(fit_framework(), pod, cluster_nodes, existing)
    assert scores(decision, NODE_RESOURCES_FIT) == expected


def test_least_allocated_weights() -> None:
    framework = fit_framework(resources=(("cpu", 1), ("memory", 2)))
    decision = run(framework, SPLIT_POD, nodes(("4000", "10000"), ("6000", "10000")))
    assert scores(decision, NODE_RESOURCES_FIT) == {"node1": 41, "node2": 50}


def test_most_allocated() -> None:
    framework = fit_framework(ScoringStrategy.MOST_ALLOCATED)
    decision = run(framework, SPLIT_POD, nodes(("4000", "10000"), ("6000", "10000")))
    assert scores(decision, NODE_RESOURCES_FIT) == {"node1": 62, "node2": 50}
    over = run(framework, requested("5000", "0"), nodes(("4000", "10000")))
    # Requests beyond capacity are capped at capacity: cpu 100, memory 0 -> 50.
    assert scores(over, NODE_RESOURCES_FIT) == {"node1": 50}


def test_non_zero_defaults_for_unset_requests() -> None:
    # A pod without requests counts as 100m / 200Mi when scoring.
    decision = run(fit_framework(), make_pod().container(), nodes(("1", "400Mi")))
    assert scores(decision, NODE_RESOURCES_FIT) == {"node1": (90 + 50) // 2}


def test_extended_resources_scored_only_when_requested() -> None:
    framework = fit_framework(resources=(("cpu", 1), ("nvidia.com/gpu", 3)))
    cluster_nodes = [
        make_node("gpu", cpu="4").resource("nvidia.com/gpu", "4"),
        make_node("plain", cpu="4"),
    ]
    pod = make_pod("p", cpu="2", resources={"nvidia.com/gpu": "1"})
    decision = run(framework, pod, cluster_nodes)
    # gpu node: (50 * 1 + 75 * 3) / 4 = 68; plain node lacks the gpu column: cpu only.
    assert scores(decision, NODE_RESOURCES_FIT) == {"gpu": 68, "plain": 50}
    decision = run(framework, make_pod("p", cpu="2"), cluster_nodes)
    assert scores(decision, NODE_RESOURCES_FIT) == {"gpu": 50, "plain": 50}


@pytest.mark.parametrize(
    ("pod", "cluster_nodes", "existing", "expected"),
    [
        pytest.param(
            SPLIT_POD,
            nodes(("4000", "10000"), ("6000", "10000")),
            [],
            {"node1": 87, "node2": 100},
            id="fractions-0.75-0.5",
        ),
        pytest.param(
            requested("1000", "0"),
            nodes(("4000", "10000"), ("4000", "10000")),
            [(requested("3000", "0"), "node1"), (requested("0", "5000"), "node2")],
            {"node1": 50, "node2": 87},
            id="with-existing-pods",
        ),
        pytest.param(
            requested("8000", "0"),
            nodes(("4000", "10000")),
            [],
            {"node1": 50},
            id="fraction-capped-at-one",
        ),
    ],
)
def test_balanced_allocation(
    pod: PodBuilder,
    cluster_nodes: list[NodeBuilder],
    existing: list[tuple[PodBuilder, str]],
    expected: dict[str, int],
) -> None:
    decision = run(only_score(BALANCED_ALLOCATION), pod, cluster_nodes, existing)
    assert scores(decision, BALANCED_ALLOCATION) == expected


def test_balanced_allocation_skips_best_effort_pods() -> None:
    decision = run(only_score(BALANCED_ALLOCATION), make_pod().container(), nodes(("4", "8Gi")))
    assert decision.explanation.skipped_scores == (BALANCED_ALLOCATION,)


def test_balanced_allocation_float_matches_go() -> None:
    # (1 - |0.5 - 0.68| / 2) * 100 is 91 exactly but 90.99999999999999 in float64, which
    # kube-scheduler truncates to 90; we reproduce the float arithmetic.
    decision = run(only_score(BALANCED_ALLOCATION), requested("5", "68"), nodes(("10", "100")))
    assert scores(decision, BALANCED_ALLOCATION) == {"node1": 90}


@pytest.mark.parametrize(
    ("pod", "cluster_nodes", "expected"),
    [
        pytest.param(
            make_pod().toleration("foo", "bar", "PreferNoSchedule"),
            [
                make_node("nodeA").taint("foo", "bar", "PreferNoSchedule"),
                make_node("nodeB").taint("foo", "blah", "PreferNoSchedule"),
            ],
            {"nodeA": 100, "nodeB": 0},
            id="tolerated-taint-scores-higher",
        ),
        pytest.param(
            make_pod()
            .toleration("cpu-type", "arm64", "PreferNoSchedule")
            .toleration("disk-type", "ssd", "PreferNoSchedule"),
            [
                make_node("nodeA"),
                make_node("nodeB").taint("cpu-type", "arm64", "PreferNoSchedule"),
                make_node("nodeC")
                .taint("cpu-type", "arm64", "PreferNoSchedule")
                .taint("disk-type", "ssd", "PreferNoSchedule"),
            ],
            {"nodeA": 100, "nodeB": 100, "nodeC": 100},
            id="all-tolerated",
        ),
        pytest.param(
            make_pod().toleration("foo", "bar", "PreferNoSchedule"),
            [
                make_node("nodeA"),
                make_node("nodeB").taint("cpu-type", "arm64", "PreferNoSchedule"),
                make_node("nodeC")
                .taint("cpu-type", "arm64", "PreferNoSchedule")
                .taint("disk-type", "ssd", "PreferNoSchedule"),
            ],
            {"nodeA": 100, "nodeB": 50, "nodeC": 0},
            id="more-intolerable-taints-lower-score",
        ),
        pytest.param(
            make_pod().toleration("cpu-type", "arm64", "NoSchedule"),
            [make_node("nodeA"), make_node("nodeB").taint("cpu-type", "arm64", "PreferNoSchedule")],
            {"nodeA": 100, "nodeB": 0},
            id="noschedule-toleration-does-not-count",
        ),
        pytest.param(
            make_pod(),
            [make_node("nodeA"), make_node("nodeB").taint("x", "y", "NoExecute")],
            {"nodeA": 100, "nodeB": 100},
            id="only-prefer-no-schedule-taints-score",
        ),
    ],
)
def test_taint_toleration_score(
    pod: PodBuilder, cluster_nodes: list[NodeBuilder], expected: dict[str, int]
) -> None:
    decision = run(only_score(TAINT_TOLERATION), pod, cluster_nodes)
    assert scores(decision, TAINT_TOLERATION) == expected

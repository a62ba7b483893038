"""Resource scores (LeastAllocated, MostAllocated, BalancedAllocation) and TaintToleration
scoring, with cases after least_allocated_test.go, most_allocated_test.go,
balanced_allocation_test.go and taint_toleration_test.go."""

from __future__ import annotations

import pytest

from scheduler.core.profile import (
    BALANCED_ALLOCATION,
    NODE_RESOURCES_FIT,
    TAINT_TOLERATION,
    BalancedAllocationArgs,
    NodeResourcesFitArgs,
    Profile,
    ScoringStrategy,
)
from scheduler.core.schedule import Framework
from scheduler.model.names import CPU, MEMORY
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


# BalancedAllocation. Each case gives kube's score per node under 1.35 (the balance with
# the pod) and under 1.36 on (50 + (50 + with - without) / 2, Go integer division); the
# comments give the fractions (without -> with the pod) and the balances (without -> with),
# each int64((1 - std) * 100). Cases after balanced_allocation_test.go of v1.37.2, whose
# comments give the same balances; "with-existing-pods" and "memory-less-node" are ours.
BALANCED_CASES = [
    pytest.param(
        # node1 cpu 0 -> .75, mem 0 -> .5: 100 -> 87; node2 0 -> .5, 0 -> .5: 100 -> 100
        SPLIT_POD,
        nodes(("4000", "10000"), ("6000", "10000")),
        [],
        {"node1": 87, "node2": 100},
        {"node1": 68, "node2": 75},
        id="nothing-scheduled-differently-sized-nodes",
    ),
    pytest.param(
        # node1 cpu .3 -> .6, mem 0 -> .25: 85 -> 82; node2 .3 -> .6, .25 -> .5: 97 -> 95
        SPLIT_POD,
        nodes(("10000", "20000"), ("10000", "20000")),
        [(requested("3000", "0"), "node1"), (requested("3000", "5000"), "node2")],
        {"node1": 82, "node2": 95},
        {"node1": 73, "node2": 74},
        id="pods-scheduled-with-resources",
    ),
    pytest.param(
        # node2 cpu .3 -> .6, mem .1 -> .2: 90 -> 80
        SPLIT_POD,
        nodes(("10000", "20000"), ("10000", "50000")),
        [(requested("3000", "0"), "node1"), (requested("3000", "5000"), "node2")],
        {"node1": 82, "node2": 80},
        {"node1": 73, "node2": 70},
        id="pods-scheduled-differently-sized-nodes",
    ),
    pytest.param(
        # node1 cpu .75 -> 1, mem 0: 62 -> 50; node2 cpu 0 -> .25, mem .5: 75 -> 87
        requested("1000", "0"),
        nodes(("4000", "10000"), ("4000", "10000")),
        [(requested("3000", "0"), "node1"), (requested("0", "5000"), "node2")],
        {"node1": 50, "node2": 87},
        {"node1": 69, "node2": 81},
        id="with-existing-pods",
    ),
    pytest.param(
        # cpu 0 -> 2 capped at 1, mem 0: 100 -> 50
        requested("8000", "0"),
        nodes(("4000", "10000")),
        [],
        {"node1": 50},
        {"node1": 50},
        id="fraction-capped-at-one",
    ),
    pytest.param(
        # node1 cpu 1, mem 0 -> 1: 50 -> 100; node2 cpu 0, mem 0 -> 1: 100 -> 50
        requested("0", "5000"),
        nodes(("3000", "5000"), ("3000", "5000")),
        [(requested("3000", "0"), "node1")],
        {"node1": 100, "node2": 50},
        {"node1": 100, "node2": 50},
        id="reaching-min-and-max",
    ),
    pytest.param(
        # node1 cpu .5 -> 1, mem 0: 75 -> 50; node2 cpu .5 -> 1, mem .5: 100 -> 75
        requested("3000", "0"),
        nodes(("6000", "10000"), ("6000", "10000")),
        [(requested("3000", "0"), "node1"), (requested("3000", "5000"), "node2")],
        {"node1": 50, "node2": 75},
        {"node1": 62, "node2": 62},
        id="requests-at-node-capacity",
    ),
    pytest.param(
        # node2 has no memory: one fraction, std 0, 100 -> 100 (kube skips allocatable 0)
        SPLIT_POD,
        [
            make_node("node1", cpu="4000", memory="10000"),
            make_node("node2", cpu="4000", memory=None),
        ],
        [],
        {"node1": 87, "node2": 100},
        {"node1": 68, "node2": 75},
        id="memory-less-node",
    ),
    pytest.param(
        # (1 - |.5 - .68| / 2) * 100 is 91 exactly but 90.99999999999999 in float64, which
        # kube-scheduler truncates to 90: 100 -> 90
        requested("5", "68"),
        nodes(("10", "100")),
        [],
        {"node1": 90},
        {"node1": 70},
        id="float-truncated-as-go",
    ),
]


@pytest.mark.parametrize(
    ("pod", "cluster_nodes", "existing", "expected_135", "expected_136"), BALANCED_CASES
)
@pytest.mark.parametrize("kube_minor", [35, 36, 37])
def test_balanced_allocation(
    pod: PodBuilder,
    cluster_nodes: list[NodeBuilder],
    existing: list[tuple[PodBuilder, str]],
    expected_135: dict[str, int],
    expected_136: dict[str, int],
    kube_minor: int,
) -> None:
    framework = only_score(BALANCED_ALLOCATION, kube_minor=kube_minor)
    decision = run(framework, pod, cluster_nodes, existing)
    expected = expected_135 if kube_minor == 35 else expected_136
    assert scores(decision, BALANCED_ALLOCATION) == expected


GPU = "nvidia.com/gpu"


def balanced_framework(resources: tuple[tuple[str, int], ...], kube_minor: int) -> Framework:
    return Framework(
        Profile(
            name="balanced",
            kube_minor=kube_minor,
            filters=(),
            scores=((BALANCED_ALLOCATION, 1),),
            balanced_allocation=BalancedAllocationArgs(resources=resources),
        )
    )


def gpu_node(name: str, gpus: str | None) -> NodeBuilder:
    node = make_node(name, cpu="3500m", memory="40000")
    return node if gpus is None else node.resource(GPU, gpus)


@pytest.mark.parametrize(
    ("pod", "cluster_nodes", "existing", "expected_135", "expected_136"),
    [
        pytest.param(
            # three fractions, population std. node1 cpu .857, mem .125, gpu .375 -> .5:
            # 69 -> 70; node2 gpu 0 -> .125: 62 -> 65. The releases pick different nodes.
            make_pod("p", resources={GPU: "1"}),
            [gpu_node("node1", "8"), gpu_node("node2", "8")],
            [
                (make_pod("e1", cpu="3000m", memory="5000", resources={GPU: "3"}), "node1"),
                (make_pod("e2", cpu="3000m", memory="5000"), "node2"),
            ],
            {"node1": 70, "node2": 65},
            {"node1": 75, "node2": 76},
            id="gpu-requested",
        ),
        pytest.param(
            # gpu not requested: not scored anywhere. cpu 0 -> .857, mem 0 -> .125: 100 -> 63
            requested("3000m", "5000"),
            [gpu_node("node1", "8"), gpu_node("node2", None)],
            [],
            {"node1": 63, "node2": 63},
            {"node1": 56, "node2": 56},
            id="gpu-not-requested",
        ),
    ],
)
@pytest.mark.parametrize("kube_minor", [35, 37])
def test_balanced_allocation_extended_resources(
    pod: PodBuilder,
    cluster_nodes: list[NodeBuilder],
    existing: list[tuple[PodBuilder, str]],
    expected_135: dict[str, int],
    expected_136: dict[str, int],
    kube_minor: int,
) -> None:
    framework = balanced_framework(((CPU, 1), (MEMORY, 1), (GPU, 1)), kube_minor)
    decision = run(framework, pod, cluster_nodes, existing)
    expected = expected_135 if kube_minor == 35 else expected_136
    assert scores(decision, BALANCED_ALLOCATION) == expected


@pytest.mark.parametrize(("kube_minor", "expected"), [(35, 100), (36, 75), (37, 75)])
def test_balanced_allocation_one_resource_is_constant(kube_minor: int, expected: int) -> None:
    """One scored resource has no spread: 100 with and without the pod, so 1.36 on give 75."""
    framework = balanced_framework(((CPU, 1),), kube_minor)
    decision = run(framework, requested("1", "1Gi"), nodes(("4", "8Gi"), ("8", "1Gi")))
    assert scores(decision, BALANCED_ALLOCATION) == {"node1": expected, "node2": expected}


@pytest.mark.parametrize(
    ("kube_minor", "chosen"), [(35, "even"), (36, "memory-heavy"), (37, "memory-heavy")]
)
def test_balanced_allocation_releases_choose_different_nodes(kube_minor: int, chosen: str) -> None:
    """A cpu-only pod. On the empty node it makes cpu .25, memory 0: 100 -> 87 (1.36: 68).
    On the node whose memory is .6 used it narrows the gap, .6 against .25: 70 -> 82
    (1.36: 81). 1.35 prefers the node that stays more even; 1.36 the one the pod evens out."""
    cluster_nodes = [make_node(n, cpu="4", memory="10Gi") for n in ("even", "memory-heavy")]
    existing = [(make_pod("e", memory="6Gi"), "memory-heavy")]
    framework = only_score(BALANCED_ALLOCATION, kube_minor=kube_minor)
    decision = run(framework, requested("1", "0"), cluster_nodes, existing)
    old, new = {"even": 87, "memory-heavy": 82}, {"even": 68, "memory-heavy": 81}
    assert scores(decision, BALANCED_ALLOCATION) == (old if kube_minor == 35 else new)
    assert decision.selected == chosen


@pytest.mark.parametrize("kube_minor", [35, 36, 37])
def test_balanced_allocation_skips_best_effort_pods(kube_minor: int) -> None:
    """kube's PreScore Skip, unchanged in 1.36: no "75 for no change" for empty pods."""
    framework = only_score(BALANCED_ALLOCATION, kube_minor=kube_minor)
    decision = run(framework, make_pod().container(), nodes(("4", "8Gi")))
    assert decision.explanation.skipped_scores == (BALANCED_ALLOCATION,)


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

"""PodTopologySpread filter and score (cases after podtopologyspread/filtering_test.go
TestSingleConstraint/TestMultipleConstraints and scoring_test.go)."""

from __future__ import annotations

import pytest

from scheduler.core.framework import Code
from scheduler.core.plugins import pod_topology_spread as pts
from scheduler.core.profile import POD_TOPOLOGY_SPREAD
from tests.builders import NodeBuilder, PodBuilder, expr, make_node, make_pod
from tests.core.support import only_filter, only_score, run, scores

OK, NO, NEVER = Code.SUCCESS, Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE
FOO = {"foo": ""}


def four_nodes() -> list[NodeBuilder]:
    return [
        make_node("node-a", zone="zone1", node="node-a"),
        make_node("node-b", zone="zone1", node="node-b"),
        make_node("node-x", zone="zone2", node="node-x"),
        make_node("node-y", zone="zone2", node="node-y"),
    ]


def foo_pods(*placements: str) -> list[tuple[PodBuilder, str]]:
    """One foo-labelled pod per entry, e.g. ("node-a", "node-a", "node-y")."""
    return [(make_pod(f"p{i}").labels(FOO), node) for i, node in enumerate(placements)]


def codes(
    pod: PodBuilder,
    pods: list[tuple[PodBuilder, str]],
    nodes: list[NodeBuilder] | None = None,
) -> dict[str, Code]:
    decision = run(only_filter(pts.NAME), pod, nodes or four_nodes(), pods)
    explanation = decision.explanation
    return {name: explanation.node(name).code for name in explanation.node_names}


def spread(key: str = "zone", max_skew: int = 1, **kwargs: object) -> PodBuilder:
    return make_pod("p").labels(FOO).spread(max_skew, key, FOO, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pod", "pods", "expected"),
    [
        pytest.param(spread(), [], dict.fromkeys(("a", "b", "x", "y"), OK), id="no-existing-pods"),
        pytest.param(
            make_pod("p").labels(FOO).spread(1, "zone", {"bar": ""}),
            [],
            dict.fromkeys(("a", "b", "x", "y"), OK),
            id="incoming-does-not-match-itself",
        ),
        pytest.param(
            spread(),
            [
                (make_pod("o1", namespace="ns1").labels(FOO), "node-a"),
                (make_pod("o2", namespace="ns2").labels(FOO), "node-a"),
                *foo_pods("node-x", "node-y"),
            ],
            {"a": OK, "b": OK, "x": NO, "y": NO},
            id="other-namespaces-do-not-count",
        ),
        pytest.param(
            make_pod("p").labels(FOO).spread(1, "zone", label_selector={}),
            foo_pods("node-x", "node-y"),
            dict.fromkeys(("a", "b", "x", "y"), OK),
            id="empty-selector-counts-nothing",
        ),
        pytest.param(
            make_pod("p").labels(FOO).spread(1, "zone", null_selector=True),
            foo_pods("node-x", "node-y"),
            dict.fromkeys(("a", "b", "x", "y"), OK),
            id="null-selector-matches-nothing",
        ),
        pytest.param(
            spread(),
            foo_pods("node-a", "node-a", "node-b", "node-y", "node-y", "node-y"),
            dict.fromkeys(("a", "b", "x", "y"), OK),
            id="zones-3-3-all-fit",
        ),
        pytest.param(
            spread("node"),
            foo_pods("node-a", "node-a", "node-b", "node-y", "node-y", "node-y"),
            {"a": NO, "b": NO, "x": OK, "y": NO},
            id="nodes-2-1-0-3-only-x",
        ),
        pytest.param(
            spread("node", 2),
            foo_pods("node-a", "node-a", "node-b", "node-y", "node-y", "node-y"),
            {"a": NO, "b": OK, "x": OK, "y": NO},
            id="nodes-2-1-0-3-max-skew-2",
        ),
        pytest.param(
            make_pod("p").label("bar", "").spread(1, "node", FOO),
            foo_pods("node-a", "node-a", "node-b", "node-y", "node-y", "node-y"),
            {"a": NO, "b": OK, "x": OK, "y": NO},
            id="pod-does-not-match-itself",
        ),
        pytest.param(
            spread("node").node_affinity_in("node", "node-a", "node-y"),
            foo_pods("node-a", "node-a", "node-b", "node-y", "node-y", "node-y"),
            # Only node-a and node-y are domains, min 2: node-a fits (b and x would be
            # rejected by NodeAffinity in a full cycle).
            {"a": OK, "b": OK, "x": OK, "y": NO},
            id="node-affinity-policy-honor",
        ),
        pytest.param(
            spread("node", node_affinity_policy="Ignore").node_affinity_in("node", "node-a"),
            foo_pods("node-a", "node-b"),
            {"a": NO, "b": NO, "x": OK, "y": OK},
            id="node-affinity-policy-ignore",
        ),
        pytest.param(
            spread("node"),
            [
                (make_pod("t").labels(FOO).terminating(), "node-a"),
                (make_pod("b").labels(FOO), "node-b"),
            ],
            {"a": OK, "b": NO, "x": OK, "y": OK},
            id="terminating-pods-excluded",
        ),
    ],
)
def test_single_constraint(
    pod: PodBuilder, pods: list[tuple[PodBuilder, str]], expected: dict[str, Code]
) -> None:
    assert codes(pod, pods) == {f"node-{k}": v for k, v in expected.items()}


def test_missing_label_is_unresolvable() -> None:
    nodes = four_nodes()
    nodes[1] = make_node("node-b", zon="zone1", node="node-b")
    got = codes(spread(), foo_pods("node-a", "node-b", "node-x", "node-y"), nodes)
    assert got == {"node-a": OK, "node-b": NEVER, "node-x": NO, "node-y": NO}
    decision = run(only_filter(pts.NAME), spread("rack"), four_nodes()[:2])
    assert decision.summary == (
        "0/2 nodes are available: 2 node(s) didn't match pod topology spread constraints "
        "(missing required label)."
    )


def test_min_domains_treats_missing_domains_as_empty() -> None:
    nodes = [make_node(f"node-{c}", node=f"node-{c}") for c in "abc"]
    pods = foo_pods("node-a", "node-a", "node-b", "node-b", "node-c")
    got = codes(spread("node", 2, min_domains=3), pods, nodes)
    assert got == {"node-a": OK, "node-b": OK, "node-c": OK}
    got = codes(spread("node", 2, min_domains=4), pods, nodes)
    # Fewer domains (3) than minDomains (4): the global minimum is taken as 0.
    assert got == {"node-a": NO, "node-b": NO, "node-c": OK}


def test_node_taints_policy() -> None:
    nodes = four_nodes()
    nodes[2] = make_node("node-x", zone="zone2", node="node-x").taint("dedicated", "x")
    pods = foo_pods("node-a", "node-y")
    # Ignore (default): node-x counts as an empty domain, so node-a and node-y are skewed.
    assert codes(spread("node"), pods, nodes) == {
        "node-a": NO,
        "node-b": OK,
        "node-x": OK,
        "node-y": NO,
    }
    honored = codes(spread("node", node_taints_policy="Honor"), pods, nodes)
    assert honored == {"node-a": NO, "node-b": OK, "node-x": OK, "node-y": NO}
    pods = foo_pods("node-a", "node-b", "node-y")
    assert codes(spread("node", node_taints_policy="Honor"), pods, nodes)["node-a"] == OK
    assert codes(spread("node"), pods, nodes)["node-a"] == NO


def test_multiple_constraints_need_all_keys_to_count() -> None:
    pod = spread("zone").spread(1, "node", FOO)
    nodes = four_nodes()
    nodes[3] = make_node("node-y", zone="zone2")  # no "node" label: not counted at all
    pods = foo_pods("node-a", "node-y", "node-y")
    got = codes(pod, pods, nodes)
    # zone1 has 1, zone2 counts 0 (node-y's pods are invisible); node-y lacks "node".
    assert got == {"node-a": NO, "node-b": NO, "node-x": OK, "node-y": NEVER}


def test_match_label_keys() -> None:
    pod = (
        make_pod("p")
        .labels({"app": "web", "rev": "2"})
        .spread(1, "node", {"app": "web"}, match_label_keys=["rev"])
    )
    pods = [
        (make_pod("old1").labels({"app": "web", "rev": "1"}), "node-a"),
        (make_pod("old2").labels({"app": "web", "rev": "1"}), "node-a"),
        (make_pod("new").labels({"app": "web", "rev": "2"}), "node-b"),
    ]
    assert codes(pod, pods) == {"node-a": OK, "node-b": NO, "node-x": OK, "node-y": OK}


def test_expressions_in_selector() -> None:
    pod = make_pod("p").label("tier", "a").spread(1, "zone", expressions=[expr("tier", "Exists")])
    pods = [
        (make_pod("q").label("tier", "b"), "node-a"),
        (make_pod("r").label("tier", "c"), "node-b"),
    ]
    assert codes(pod, pods) == {"node-a": NO, "node-b": NO, "node-x": OK, "node-y": OK}


def test_skipped_without_hard_constraints() -> None:
    decision = run(only_filter(pts.NAME), spread(hard=False), four_nodes())
    assert decision.explanation.skipped_filters == (pts.NAME,)


def soft(key: str = "zone", max_skew: int = 1) -> PodBuilder:
    return make_pod("p").labels(FOO).spread(max_skew, key, FOO, hard=False)


def test_score_prefers_emptier_domains() -> None:
    nodes = [
        make_node("a1", zone="a"),
        make_node("a2", zone="a"),
        make_node("b1", zone="b"),
    ]
    decision = run(only_score(POD_TOPOLOGY_SPREAD), soft(), nodes, foo_pods("a1", "a1"))
    # zone a: 2 pods * log(2 + 2) = 2.77 -> 3; zone b: 0. Normalised: 100 * (3 + 0 - s) / 3.
    assert scores(decision, POD_TOPOLOGY_SPREAD) == {"a1": 0, "a2": 0, "b1": 100}


def test_score_hostname_counts_each_node() -> None:
    nodes = [make_node(f"n{i}") for i in range(3)]
    pod = soft("kubernetes.io/hostname", max_skew=2)
    decision = run(only_score(POD_TOPOLOGY_SPREAD), pod, nodes, foo_pods("n0", "n0", "n1"))
    # weight log(3 + 2) = 1.609; raw = round(cnt * 1.609 + 1): n0 = 4, n1 = 3, n2 = 1.
    assert scores(decision, POD_TOPOLOGY_SPREAD) == {"n0": 25, "n1": 50, "n2": 100}


def test_score_ignores_nodes_without_the_key() -> None:
    nodes = [make_node("a1", zone="a"), make_node("bare")]
    decision = run(only_score(POD_TOPOLOGY_SPREAD), soft(), nodes, foo_pods("a1"))
    assert scores(decision, POD_TOPOLOGY_SPREAD) == {"a1": 100, "bare": 0}


def test_score_skipped_without_soft_constraints() -> None:
    decision = run(only_score(POD_TOPOLOGY_SPREAD), spread(), four_nodes())
    assert decision.explanation.skipped_scores == (POD_TOPOLOGY_SPREAD,)

"""InterPodAffinity filter and score (cases after interpodaffinity/filtering_test.go and
scoring_test.go), run through the framework so reasons and codes are checked end to end."""

from __future__ import annotations

import pytest

from scheduler.core.framework import Code
from scheduler.core.plugins import inter_pod_affinity as ipa
from scheduler.core.profile import INTER_POD_AFFINITY
from tests.builders import NodeBuilder, PodBuilder, expr, make_namespace, make_node, make_pod
from tests.core.support import only_filter, only_score, reasons, run, scores

AFF = ipa.REASON_AFFINITY
ANTI = ipa.REASON_ANTI_AFFINITY
EXISTING = ipa.REASON_EXISTING_ANTI_AFFINITY
SEC = {"service": "securityscan"}


def three_nodes() -> list[NodeBuilder]:
    return [
        make_node("nodeA", region="r1", zone="z1"),
        make_node("nodeB", region="r1", zone="z2"),
        make_node("nodeC", region="r2", zone="z3"),
    ]


def verdicts(
    pod: PodBuilder,
    pods: list[tuple[PodBuilder, str]],
    nodes: list[NodeBuilder] | None = None,
    namespaces: tuple[str, ...] = (),
) -> dict[str, tuple[str, ...]]:
    ns = [make_namespace(n, team=n.split(".")[-1]) for n in namespaces]
    decision = run(only_filter(ipa.NAME), pod, nodes or three_nodes(), pods, ns)
    return reasons(decision)


def test_no_rules_skip() -> None:
    decision = run(only_filter(ipa.NAME), make_pod(), three_nodes(), [(make_pod("x"), "nodeA")])
    assert decision.explanation.skipped_filters == (ipa.NAME,)


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(
            make_pod().pod_affinity("region", expressions=[expr("service", "In", "securityscan")]),
            {"nodeA": (), "nodeB": (), "nodeC": (AFF,)},
            id="affinity-in-region",
        ),
        pytest.param(
            make_pod().pod_affinity("zone", expressions=[expr("service", "NotIn", "other")]),
            {"nodeA": (), "nodeB": (AFF,), "nodeC": (AFF,)},
            id="affinity-notin-zone",
        ),
        pytest.param(
            make_pod().pod_affinity("region", SEC, namespaces=["other"]),
            {"nodeA": (AFF,), "nodeB": (AFF,), "nodeC": (AFF,)},
            id="affinity-other-namespace",
        ),
        pytest.param(
            make_pod().pod_affinity("region", {"service": "antivirusscan"}),
            {"nodeA": (AFF,), "nodeB": (AFF,), "nodeC": (AFF,)},
            id="affinity-selector-does-not-match",
        ),
        pytest.param(
            make_pod().pod_affinity(
                "region",
                expressions=[expr("service", "Exists"), expr("wrongkey", "DoesNotExist")],
            ),
            {"nodeA": (), "nodeB": (), "nodeC": (AFF,)},
            id="anded-expressions",
        ),
        pytest.param(
            make_pod().pod_affinity(
                "region", expressions=[expr("service", "Exists"), expr("service", "In", "x")]
            ),
            {"nodeA": (AFF,), "nodeB": (AFF,), "nodeC": (AFF,)},
            id="anded-expressions-one-fails",
        ),
        pytest.param(
            make_pod().pod_affinity("region", SEC).pod_anti_affinity("zone", {"service": "x"}),
            {"nodeA": (), "nodeB": (), "nodeC": (AFF,)},
            id="affinity-and-unrelated-anti-affinity",
        ),
        pytest.param(
            make_pod().pod_affinity("region", SEC).pod_anti_affinity("zone", SEC),
            {"nodeA": (ANTI,), "nodeB": (), "nodeC": (AFF,)},
            id="affinity-ok-anti-affinity-violated",
        ),
        pytest.param(
            make_pod().pod_anti_affinity("zone", SEC).pod_anti_affinity("region", {"x": "y"}),
            {"nodeA": (ANTI,), "nodeB": (), "nodeC": ()},
            id="any-anti-term-is-enough",
        ),
        pytest.param(
            make_pod().pod_anti_affinity("hostname-missing", SEC),
            {"nodeA": (), "nodeB": (), "nodeC": ()},
            id="anti-affinity-topology-key-absent",
        ),
    ],
)
def test_incoming_pod_rules(pod: PodBuilder, expected: dict[str, tuple[str, ...]]) -> None:
    existing = make_pod("existing").labels(SEC)
    assert verdicts(pod, [(existing, "nodeA")]) == expected


def test_first_pod_of_a_group_may_go_anywhere_with_the_key() -> None:
    pod = make_pod().labels(SEC).pod_affinity("region", SEC)
    nodes = [*three_nodes(), make_node("bare")]
    got = verdicts(pod, [], nodes)
    assert got == {"nodeA": (), "nodeB": (), "nodeC": (), "bare": (AFF,)}


def test_self_match_only_when_no_pod_matches_anywhere() -> None:
    pod = make_pod().labels(SEC).pod_affinity("zone", SEC)
    existing = make_pod("existing").labels(SEC)
    got = verdicts(pod, [(existing, "nodeA")])
    assert got == {"nodeA": (), "nodeB": (AFF,), "nodeC": (AFF,)}


def test_matching_pod_on_unlabelled_node_does_not_count() -> None:
    # The only matching pod runs on a node without the topology key: no count is recorded,
    # so the self-match rule applies.
    pod = make_pod().labels(SEC).pod_affinity("zone", SEC)
    nodes = [*three_nodes(), make_node("bare")]
    got = verdicts(pod, [(make_pod("existing").labels(SEC), "bare")], nodes)
    assert got == {"nodeA": (), "nodeB": (), "nodeC": (), "bare": (AFF,)}


def test_all_terms_must_match_the_same_pod() -> None:
    pod = make_pod().pod_affinity("region", {"foo": ""}).pod_affinity("zone", {"bar": ""})
    pods = [(make_pod("p1").label("foo", ""), "nodeA"), (make_pod("p2").label("bar", ""), "nodeB")]
    got = verdicts(pod, pods)
    assert got == {"nodeA": (AFF,), "nodeB": (AFF,), "nodeC": (AFF,)}


def test_terms_with_different_keys_each_need_their_domain() -> None:
    pod = make_pod().pod_affinity("region", {"foo": ""}).pod_affinity("zone", {"foo": ""})
    got = verdicts(pod, [(make_pod("p1").label("foo", ""), "nodeA")])
    assert got == {"nodeA": (), "nodeB": (AFF,), "nodeC": (AFF,)}


@pytest.mark.parametrize(
    ("existing", "expected"),
    [
        pytest.param(
            make_pod("existing").pod_anti_affinity("zone", SEC),
            {"nodeA": (EXISTING,), "nodeB": (), "nodeC": ()},
            id="existing-anti-affinity-zone",
        ),
        pytest.param(
            make_pod("existing").pod_anti_affinity("region", SEC),
            {"nodeA": (EXISTING,), "nodeB": (EXISTING,), "nodeC": ()},
            id="existing-anti-affinity-region",
        ),
        pytest.param(
            make_pod("existing").pod_anti_affinity("region", {"service": "other"}),
            {"nodeA": (), "nodeB": (), "nodeC": ()},
            id="existing-anti-affinity-no-match",
        ),
        pytest.param(
            make_pod("existing").pod_anti_affinity("absent-key", SEC),
            {"nodeA": (), "nodeB": (), "nodeC": ()},
            id="existing-anti-affinity-key-missing-on-its-node",
        ),
        pytest.param(
            make_pod("existing", namespace="other").pod_anti_affinity("zone", SEC),
            {"nodeA": (), "nodeB": (), "nodeC": ()},
            id="existing-term-defaults-to-its-own-namespace",
        ),
    ],
)
def test_existing_pods_anti_affinity(
    existing: PodBuilder, expected: dict[str, tuple[str, ...]]
) -> None:
    incoming = make_pod().labels(SEC)
    assert verdicts(incoming, [(existing, "nodeA")]) == expected


def test_reason_order_and_codes() -> None:
    pod = (
        make_pod().labels(SEC).pod_affinity("region", {"app": "db"}).pod_anti_affinity("zone", SEC)
    )
    pods = [
        (make_pod("db").label("app", "db"), "nodeA"),
        (make_pod("sec").labels(SEC), "nodeA"),
        (make_pod("guard").pod_anti_affinity("zone", SEC), "nodeB"),
    ]
    decision = run(only_filter(ipa.NAME), pod, three_nodes(), pods)
    explanation = decision.explanation
    assert explanation.node("nodeA").reasons == (ANTI,)
    assert explanation.node("nodeA").code is Code.UNSCHEDULABLE
    assert explanation.node("nodeB").reasons == (EXISTING,)
    assert explanation.node("nodeC").reasons == (AFF,)
    assert explanation.node("nodeC").code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert decision.summary == (
        "0/3 nodes are available: 1 node(s) didn't match pod affinity rules, "
        "1 node(s) didn't match pod anti-affinity rules, "
        "1 node(s) didn't satisfy existing pods anti-affinity rules."
    )


def test_namespace_selectors() -> None:
    team1 = {"matchExpressions": [expr("team", "In", "team1")]}
    existing = make_pod("existing", namespace="subteam1.team1").labels(SEC)
    namespaces = ("subteam1.team1", "subteam1.team2", "default")
    pod = make_pod().pod_affinity("region", SEC, namespace_selector=team1)
    assert verdicts(pod, [(existing, "nodeA")], namespaces=namespaces)["nodeA"] == ()
    other = make_pod("existing", namespace="subteam1.team2").labels(SEC)
    assert verdicts(pod, [(other, "nodeA")], namespaces=namespaces)["nodeA"] == (AFF,)
    anti_all = make_pod(namespace="subteam1.team1").pod_anti_affinity(
        "zone", SEC, namespace_selector={}
    )
    assert verdicts(anti_all, [(other, "nodeA")], namespaces=namespaces)["nodeA"] == (ANTI,)


def test_incoming_namespace_selector_matching_empty_labels_selects_every_namespace() -> None:
    # kube-scheduler quirk: the incoming pod's namespaceSelector is also evaluated against an
    # empty label set, so NotIn/DoesNotExist selectors match pods in every namespace.
    not_team1 = {"matchExpressions": [expr("team", "NotIn", "team1")]}
    pod = make_pod().pod_anti_affinity("zone", SEC, namespace_selector=not_team1)
    existing = make_pod("existing", namespace="subteam1.team1").labels(SEC)
    got = verdicts(pod, [(existing, "nodeA")], namespaces=("subteam1.team1",))
    assert got["nodeA"] == (ANTI,)


def test_existing_namespace_selector_uses_incoming_namespace_labels() -> None:
    team1 = {"matchExpressions": [expr("team", "In", "team1")]}
    guard = make_pod("guard", namespace="x").pod_anti_affinity(
        "zone", SEC, namespace_selector=team1
    )
    inside = make_pod(namespace="subteam1.team1").labels(SEC)
    outside = make_pod(namespace="subteam1.team2").labels(SEC)
    namespaces = ("subteam1.team1", "subteam1.team2")
    assert verdicts(inside, [(guard, "nodeA")], namespaces=namespaces)["nodeA"] == (EXISTING,)
    assert verdicts(outside, [(guard, "nodeA")], namespaces=namespaces)["nodeA"] == ()


def test_match_label_keys_restrict_to_the_same_revision() -> None:
    pod = (
        make_pod()
        .labels({"app": "web", "rev": "2"})
        .pod_anti_affinity("zone", {"app": "web"}, match_label_keys=["rev"])
    )
    old = make_pod("old").labels({"app": "web", "rev": "1"})
    same = make_pod("same").labels({"app": "web", "rev": "2"})
    got = verdicts(pod, [(old, "nodeA"), (same, "nodeB")])
    assert got == {"nodeA": (), "nodeB": (ANTI,), "nodeC": ()}


def score_nodes() -> list[NodeBuilder]:
    return [
        make_node("n1", region="china", zone="az1"),
        make_node("n2", region="india", zone="az2"),
        make_node("n3", region="china", zone="az3"),
    ]


def test_preferred_affinity_scores() -> None:
    pod = make_pod().pod_affinity("region", SEC, weight=5)
    pods = [(make_pod("s").labels(SEC), "n1")]
    decision = run(only_score(INTER_POD_AFFINITY), pod, score_nodes(), pods)
    assert scores(decision, INTER_POD_AFFINITY) == {"n1": 100, "n2": 0, "n3": 100}


def test_preferred_anti_affinity_scores() -> None:
    pod = (
        make_pod()
        .pod_anti_affinity("region", SEC, weight=5)
        .pod_affinity("zone", {"app": "x"}, weight=3)
    )
    pods = [(make_pod("s").labels(SEC), "n1"), (make_pod("x").label("app", "x"), "n2")]
    decision = run(only_score(INTER_POD_AFFINITY), pod, score_nodes(), pods)
    # raw: n1 = -5, n2 = +3, n3 = -5 (same region as n1) -> min-max scaled.
    assert scores(decision, INTER_POD_AFFINITY) == {"n1": 0, "n2": 100, "n3": 0}


def test_existing_pods_terms_score_the_incoming_pod() -> None:
    pods = [
        (make_pod("hard").pod_affinity("zone", SEC), "n1"),
        (make_pod("soft").pod_affinity("region", SEC, weight=4), "n2"),
        (make_pod("avoid").pod_anti_affinity("zone", SEC, weight=2), "n3"),
    ]
    decision = run(only_score(INTER_POD_AFFINITY), make_pod().labels(SEC), score_nodes(), pods)
    # raw: n1 = +1 (hard weight), n2 = +4, n3 = -2 -> (s + 2) * 100 / 6
    assert scores(decision, INTER_POD_AFFINITY) == {"n1": 50, "n2": 100, "n3": 0}


def test_score_skipped_without_any_affinity() -> None:
    decision = run(
        only_score(INTER_POD_AFFINITY), make_pod(), score_nodes(), [(make_pod("x"), "n1")]
    )
    assert decision.explanation.skipped_scores == (INTER_POD_AFFINITY,)

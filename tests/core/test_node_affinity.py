"""NodeAffinity filter, PreFilter node sets and score (cases after node_affinity_test.go)."""

from __future__ import annotations

import pytest

from scheduler.core.framework import Code
from scheduler.core.plugins import node_affinity
from tests.builders import PodBuilder, expr, make_node, make_pod
from tests.core.support import only_filter, only_score, reasons, run, scores

REASON = node_affinity.REASON
NAME_FIELD = "metadata.name"


def filter_one(pod: PodBuilder, labels: dict[str, str], name: str = "node1") -> tuple[str, ...]:
    node = make_node(name).labels(labels)
    return reasons(run(only_filter(node_affinity.NAME), pod, [node]))[name]


@pytest.mark.parametrize(
    ("pod", "labels", "rejected"),
    [
        pytest.param(make_pod().node_selector({"foo": "bar"}), {}, True, id="missing-labels"),
        pytest.param(make_pod().node_selector({"foo": "bar"}), {"foo": "bar"}, False, id="same"),
        pytest.param(
            make_pod().node_selector({"foo": "bar"}),
            {"foo": "bar", "baz": "blah"},
            False,
            id="node-labels-superset",
        ),
        pytest.param(
            make_pod().node_selector({"foo": "bar", "baz": "blah"}),
            {"foo": "bar"},
            True,
            id="node-labels-subset",
        ),
        pytest.param(
            make_pod().node_affinity_in("foo", "bar", "value2"), {"foo": "bar"}, False, id="in"
        ),
        pytest.param(
            make_pod().node_affinity_term(expr("kernel-version", "Gt", "0204")),
            {"kernel-version": "0206"},
            False,
            id="gt",
        ),
        pytest.param(
            make_pod().node_affinity_term(expr("mem-type", "NotIn", "DDR", "DDR2")),
            {"mem-type": "DDR3"},
            False,
            id="notin",
        ),
        pytest.param(
            make_pod().node_affinity_term(expr("GPU", "Exists")),
            {"GPU": "NVIDIA-GRID-K1"},
            False,
            id="exists",
        ),
        pytest.param(
            make_pod().node_affinity_in("foo", "value1", "value2"),
            {"foo": "bar"},
            True,
            id="no-match",
        ),
        pytest.param(
            make_pod().node_affinity_term(), {"foo": "bar"}, True, id="empty-term-matches-nothing"
        ),
        pytest.param(make_pod(), {"foo": "bar"}, False, id="no-affinity"),
        pytest.param(
            make_pod().node_affinity_term(
                expr("GPU", "Exists"), expr("GPU", "NotIn", "AMD", "INTER")
            ),
            {"GPU": "NVIDIA-GRID-K1"},
            False,
            id="anded-expressions-match",
        ),
        pytest.param(
            make_pod().node_affinity_term(expr("GPU", "Exists"), expr("GPU", "In", "AMD", "INTER")),
            {"GPU": "NVIDIA-GRID-K1"},
            True,
            id="anded-expressions-do-not-match",
        ),
        pytest.param(
            make_pod()
            .node_affinity_term(expr("foo", "In", "bar", "value2"))
            .node_affinity_term(expr("diffkey", "In", "wrong", "value2")),
            {"foo": "bar"},
            False,
            id="terms-ored",
        ),
        pytest.param(
            make_pod().node_selector({"foo": "bar"}).node_affinity_term(expr("foo", "Exists")),
            {"foo": "bar"},
            False,
            id="selector-and-affinity-both-match",
        ),
        pytest.param(
            make_pod().node_selector({"foo": "bar"}).node_affinity_term(expr("foo", "Exists")),
            {"foo": "barrrrrr"},
            True,
            id="affinity-matches-selector-does-not",
        ),
        pytest.param(
            make_pod().node_affinity_term(fields=[expr(NAME_FIELD, "In", "node1")]),
            {},
            False,
            id="match-fields-in",
        ),
        pytest.param(
            make_pod().node_affinity_term(fields=[expr(NAME_FIELD, "NotIn", "node1")]),
            {},
            True,
            id="match-fields-notin",
        ),
        pytest.param(
            make_pod()
            .node_affinity_term(fields=[expr(NAME_FIELD, "In", "node2")])
            .node_affinity_term(expr("foo", "In", "bar")),
            {"foo": "bar"},
            False,
            id="fields-miss-expressions-match-two-terms",
        ),
        pytest.param(
            make_pod().node_affinity_term(
                expr("foo", "In", "bar"), fields=[expr(NAME_FIELD, "In", "node1")]
            ),
            {"foo": "bar"},
            False,
            id="fields-and-expressions-match",
        ),
        pytest.param(
            make_pod().node_affinity_term(expr("gen", "Lt", "5")),
            {"gen": "v4"},
            True,
            id="lt-on-non-integer-label",
        ),
    ],
)
def test_filter(pod: PodBuilder, labels: dict[str, str], rejected: bool) -> None:
    assert filter_one(pod, labels) == ((REASON,) if rejected else ())


def test_fields_miss_in_one_term_makes_the_node_absent() -> None:
    # kube's Filter alone would say "didn't match Pod's node affinity/selector", but in a
    # full cycle PreFilter already narrowed the candidates to node2.
    pod = make_pod().node_affinity_term(
        expr("foo", "In", "bar"), fields=[expr(NAME_FIELD, "In", "node2")]
    )
    assert filter_one(pod, {"foo": "bar"}) == ("node(s) didn't satisfy plugin(s) [NodeAffinity]",)


def test_node_name_terms_narrow_candidates() -> None:
    pod = (
        make_pod()
        .node_affinity_term(fields=[expr(NAME_FIELD, "In", "node1")])
        .node_affinity_term(fields=[expr(NAME_FIELD, "In", "node2")])
    )
    nodes = [make_node(f"node{i}") for i in range(1, 5)]
    nodes[0].unschedulable()
    decision = run(only_filter(node_affinity.NAME), pod, nodes)
    assert decision.feasible == ("node1", "node2")
    # Through the default profile the narrowed-out nodes carry the "absent" status.
    from scheduler.core.schedule import schedule
    from tests.builders import cluster

    decision = schedule(cluster(nodes), pod.build())
    assert decision.feasible == ("node2",)
    assert decision.reason_counts() == {
        "node(s) were unschedulable": 1,
        "node(s) didn't satisfy plugin(s) [NodeAffinity]": 2,
    }
    assert decision.explanation.node("node3").plugin == node_affinity.NAME


def test_unknown_node_names_leave_no_candidate() -> None:
    from scheduler.core.schedule import schedule
    from tests.builders import cluster

    pod = make_pod().node_affinity_term(fields=[expr(NAME_FIELD, "In", "ghost")]).build()
    decision = schedule(cluster([make_node("a"), make_node("b")]), pod)
    assert decision.summary == (
        "0/2 nodes are available: 2 node(s) didn't satisfy plugin(s) [NodeAffinity]."
    )


def test_conflicting_name_requirements_reject_at_prefilter() -> None:
    pod = make_pod().node_affinity_term(
        fields=[expr(NAME_FIELD, "In", "node1"), expr(NAME_FIELD, "In", "node2")]
    )
    decision = run(only_filter(node_affinity.NAME), pod, [make_node("node1"), make_node("node2")])
    assert decision.summary == "0/2 nodes are available: pod affinity terms conflict."
    assert decision.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert decision.reason_counts() == {"pod affinity terms conflict": 2}


def test_empty_term_disables_narrowing() -> None:
    pod = (
        make_pod().node_affinity_term().node_affinity_term(fields=[expr(NAME_FIELD, "In", "node1")])
    )
    decision = run(only_filter(node_affinity.NAME), pod, [make_node("node1"), make_node("node2")])
    assert decision.feasible == ("node1",)
    assert reasons(decision)["node2"] == (REASON,)


def test_score_weights_normalised() -> None:
    pod = (
        make_pod()
        .preferred_node_affinity(2, expr("foo", "In", "bar"))
        .preferred_node_affinity(4, expr("key", "In", "value"))
        .preferred_node_affinity(
            5, expr("foo", "In", "bar"), expr("key", "In", "value"), expr("az", "In", "az1")
        )
    )
    nodes = [
        make_node("node1", foo="bar"),
        make_node("node5", foo="bar", key="value", az="az1"),
        make_node("node2", key="value"),
    ]
    decision = run(only_score(node_affinity.NAME), pod, nodes)
    assert scores(decision, node_affinity.NAME) == {"node1": 18, "node5": 100, "node2": 36}


def test_score_skipped_without_preferences() -> None:
    decision = run(only_score(node_affinity.NAME), make_pod(), [make_node("a")])
    assert decision.explanation.skipped_scores == (node_affinity.NAME,)


def test_score_no_match_is_zero() -> None:
    pod = make_pod().preferred_node_affinity(2, expr("foo", "In", "bar"))
    decision = run(only_score(node_affinity.NAME), pod, [make_node("a"), make_node("b")])
    assert scores(decision, node_affinity.NAME) == {"a": 0, "b": 0}

"""The affinity graph: event patches must reach the graph (and indexes) a rebuild computes."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings

from scheduler.core.snapshot import Snapshot
from scheduler.graph.affinity import AffinityGraph, declarations
from scheduler.graph.delta import AddEdge, Patch, RemoveEdge, SetAttrs, invert
from scheduler.graph.indexes import SPREAD, node_vid, pod_vid
from scheduler.graph.terms import TermKey, selects
from scheduler.model.names import LABEL_HOSTNAME
from tests.builders import expr, make_namespace, make_node, make_pod
from tests.graph.strategies import Model, event_lists, feed_snapshot


def feed(graph: AffinityGraph, event: tuple[Any, ...]) -> Patch:
    kind = event[0]
    if kind == "node":
        return graph.on_node_upserted(event[1])
    if kind == "rmnode":
        return graph.on_node_removed(event[1])
    if kind == "place":
        return graph.on_pod_placed(event[1], event[2])
    if kind == "pending":
        return graph.on_pod_pending(event[1])
    if kind == "rmpod":
        return graph.on_pod_removed(event[1])
    if kind == "ns":
        return graph.on_namespace(event[1])
    return graph.on_namespace_removed(event[1])


def rebuilt(model: Model) -> AffinityGraph:
    return AffinityGraph.build(
        model.nodes.values(), model.placed, model.namespaces.values(), model.pending
    )


def expected_counts(model: Model) -> dict[str, Any]:
    """The count indexes computed the obvious way from the final state alone."""
    ns_labels = {name: ns.labels for name, ns in model.namespaces.items()}
    terms: dict[str, TermKey] = {}
    for pod, _ in model.pods.values():
        for _, _, _, term in declarations(pod):
            terms[term.vid] = term
    match_node: dict[str, Counter[str]] = {}
    match_domain: dict[str, Counter[str]] = {}
    declared: dict[str, dict[tuple[str, int], Counter[str]]] = {}
    for pod, node_name in model.placed:
        node = model.nodes.get(node_name)
        if node is None:
            continue
        for vid, term in terms.items():
            if selects(
                term, pod.namespace, pod.labels, ns_labels.get(pod.namespace), pod.terminating
            ):
                match_node.setdefault(vid, Counter())[node_name] += 1
                if term.topology_key in node.labels:
                    value = node.labels[term.topology_key]
                    match_domain.setdefault(vid, Counter())[value] += 1
        for kind, weight, _, term in declarations(pod):
            if kind != SPREAD and term.topology_key in node.labels:
                value = node.labels[term.topology_key]
                declared.setdefault(term.vid, {}).setdefault((kind, weight), Counter())[value] += 1
    return {
        "terms": set(terms),
        "match_node": {t: dict(c) for t, c in match_node.items()},
        "match_domain": {t: dict(c) for t, c in match_domain.items()},
        "declared": {t: {k: dict(c) for k, c in by.items()} for t, by in declared.items()},
    }


def counts_of(graph: AffinityGraph) -> dict[str, Any]:
    view = graph.indexes.view()
    return {
        "terms": set(view["terms"]),
        "match_node": view["match_node"],
        "match_domain": view["match_domain"],
        "declared": view["declared"],
    }


@settings(max_examples=150, deadline=None)
@given(event_lists())
def test_patched_graph_and_indexes_equal_a_rebuild(events: list[tuple[Any, ...]]) -> None:
    graph, model = AffinityGraph(), Model()
    for event in events:
        feed(graph, event)
        model.apply(event)
    scratch = rebuilt(model)
    assert graph.graph == scratch.graph
    assert graph.indexes.view() == scratch.indexes.view()
    assert counts_of(graph) == expected_counts(model)


@settings(max_examples=60, deadline=None)
@given(event_lists())
def test_snapshot_feeds_its_graph(events: list[tuple[Any, ...]]) -> None:
    snapshot, model = Snapshot(), Model()
    for event in events:
        feed_snapshot(snapshot, event)
        model.apply(event)
    scratch = rebuilt(model)
    assert snapshot.affinity_graph.graph == scratch.graph
    assert snapshot.affinity_graph.indexes.view() == scratch.indexes.view()


@settings(max_examples=80, deadline=None)
@given(event_lists())
def test_every_event_patch_inverts_and_replays(events: list[tuple[Any, ...]]) -> None:
    graph = AffinityGraph()
    for event in events:
        before, before_view = graph.graph.copy(), graph.indexes.view()
        patch = feed(graph, event)
        after, after_view = graph.graph.copy(), graph.indexes.view()
        assert not graph.apply(patch)  # replay: no-op
        assert graph.graph == after
        undo = invert(patch, seq=graph.seq + 1)
        assert graph.apply(undo)
        assert graph.graph == before
        assert graph.indexes.view() == before_view
        assert graph.apply(Patch(graph.seq + 1, patch.ops))  # redo
        assert graph.graph == after
        assert graph.indexes.view() == after_view


def _sec_pod(name: str, node: str | None = None) -> Any:
    pod = make_pod(name).label("app", "web").pod_anti_affinity(LABEL_HOSTNAME, {"app": "web"})
    return pod.build()


def test_a_shared_term_is_one_vertex_and_leaves_with_its_last_declarer() -> None:
    graph = AffinityGraph()
    graph.on_node_upserted(make_node("a", zone="z1").build())
    graph.on_node_upserted(make_node("b", zone="z1").build())
    first, second = _sec_pod("p1"), _sec_pod("p2")
    graph.on_pod_placed(first, "a")
    graph.on_pod_placed(second, "b")
    terms = list(graph.indexes.terms)
    assert len(terms) == 1
    assert graph.indexes.match_domain[terms[0]] == {"a": 1, "b": 1}
    assert graph.indexes.declared[terms[0]] == {("required-anti-affinity", 0): {"a": 1, "b": 1}}
    graph.on_pod_removed(first.key)
    assert graph.indexes.match_domain[terms[0]] == {"b": 1}
    patch = graph.on_pod_removed(second.key)
    assert not graph.indexes.terms
    assert all(not v.startswith("term/") for v in graph.graph.vertices())
    assert patch.ops[-1].vertex == pod_vid(second.key)  # type: ignore[union-attr]


def test_terms_are_canonical() -> None:
    one = make_pod("x").pod_affinity(
        "zone", expressions=[expr("app", "In", "b", "a"), expr("tier", "Exists")]
    )
    two = make_pod("y").pod_affinity(
        "zone", expressions=[expr("tier", "Exists"), expr("app", "In", "a", "b", "a")]
    )
    key_one = TermKey.of_affinity(one.build().required_affinity[0])
    key_two = TermKey.of_affinity(two.build().required_affinity[0])
    assert key_one == key_two
    assert key_one.vid == "term/ns=default nssel=<none> sel=app in (a,b), tier @ zone"


def test_pods_of_unknown_nodes_wait_for_them() -> None:
    graph = AffinityGraph()
    pod = _sec_pod("p")
    graph.on_pod_placed(pod, "late")
    term = next(iter(graph.indexes.terms))
    assert (pod_vid(pod.key), node_vid("late"), "placed") not in graph.graph.edges()
    assert term not in graph.indexes.match_node
    graph.on_node_upserted(make_node("late").build())
    assert graph.indexes.match_node[term] == {"late": 1}
    graph.on_node_removed("late")
    assert term not in graph.indexes.match_node
    assert pod_vid(pod.key) in graph.graph


def test_relabelling_a_pod_patches_only_its_own_edges() -> None:
    graph = AffinityGraph()
    graph.on_node_upserted(make_node("a").build())
    for i in range(20):
        graph.on_pod_placed(_sec_pod(f"p{i}"), "a")
    pod = make_pod("x").uid("x").label("app", "web").build()
    graph.on_pod_placed(pod, "a")
    patch = graph.on_pod_placed(make_pod("x").uid("x").label("app", "db").build(), "a")
    assert [type(op) for op in patch.ops] == [RemoveEdge, SetAttrs]


def test_node_relabel_moves_counts_between_domains() -> None:
    graph = AffinityGraph()
    graph.on_node_upserted(make_node("a", zone="z1").build())
    pod = make_pod("p").label("app", "web").pod_affinity("zone", {"app": "web"}).build()
    graph.on_pod_placed(pod, "a")
    term = next(iter(graph.indexes.terms))
    patch = graph.on_node_upserted(make_node("a", zone="z2").build())
    assert graph.indexes.match_domain[term] == {"z2": 1}
    assert graph.indexes.declared[term] == {("required-affinity", 0): {"z2": 1}}
    assert {type(op).__name__ for op in patch.ops} == {
        "RemoveEdge",
        "RemoveVertex",
        "AddVertex",
        "AddEdge",
    }


def test_no_pod_pod_edges_even_for_a_broad_selector() -> None:
    graph = AffinityGraph()
    graph.on_node_upserted(make_node("a").build())
    for i in range(200):
        graph.on_pod_placed(make_pod(f"p{i}").label("app", "web").build(), "a")
    broad = make_pod("q").pod_anti_affinity(LABEL_HOSTNAME, expressions=[expr("app", "Exists")])
    patch = graph.on_pod_placed(broad.build(), "a")
    edges = graph.graph.edges()
    assert all(not (u.startswith("pod/") and v.startswith("pod/")) for u, v, _ in edges)
    # One matches edge per selected pod, plus the new pod's own declaration and placement.
    assert sum(1 for op in patch.ops if isinstance(op, AddEdge)) == 200 + 2


def test_namespace_labels_toggle_namespace_selector_matches() -> None:
    graph = AffinityGraph()
    graph.on_node_upserted(make_node("a").build())
    guard = make_pod("g", namespace="other").pod_anti_affinity(
        LABEL_HOSTNAME, {"app": "web"}, namespace_selector={"matchLabels": {"team": "a"}}
    )
    graph.on_pod_placed(guard.build(), "a")
    web = make_pod("w", namespace="team-ns").label("app", "web").build()
    graph.on_pod_placed(web, "a")
    term = next(iter(graph.indexes.terms))
    assert term not in graph.indexes.match_node
    graph.on_namespace(make_namespace("team-ns", team="a"))
    assert graph.indexes.match_node[term] == {"a": 1}
    graph.on_namespace(make_namespace("team-ns", team="b"))
    assert term not in graph.indexes.match_node
    graph.on_namespace(make_namespace("team-ns", team="a"))
    graph.on_namespace_removed("team-ns")
    assert term not in graph.indexes.match_node


def test_unregistered_terms_are_counted_on_the_fly() -> None:
    graph = AffinityGraph()
    for name, zone in (("a", "z1"), ("b", "z2")):
        graph.on_node_upserted(make_node(name, zone=zone).build())
    for i in range(4):
        graph.on_pod_placed(make_pod(f"p{i}").label("app", "web").build(), "ab"[i % 2])
    incoming = make_pod("new").pod_affinity("zone", {"app": "web"}).build()
    term = TermKey.of_affinity(incoming.required_affinity[0])
    transient = graph.term_counts(term)
    assert dict(transient.by_domain) == {"z1": 2, "z2": 2}
    graph.on_pod_pending(incoming)  # now the term has a vertex: the index answers the same
    indexed = graph.term_counts(term)
    assert dict(indexed.by_domain) == dict(transient.by_domain)
    assert dict(indexed.by_node) == {"a": 2, "b": 2}


def test_spread_terms_skip_terminating_pods_and_other_namespaces() -> None:
    graph = AffinityGraph()
    graph.on_node_upserted(make_node("a", zone="z1").build())
    graph.on_pod_placed(make_pod("live").label("app", "web").build(), "a")
    graph.on_pod_placed(make_pod("dying").label("app", "web").terminating().build(), "a")
    graph.on_pod_placed(make_pod("far", namespace="x").label("app", "web").build(), "a")
    spreading = make_pod("s").spread(1, "zone", {"app": "web"}).build()
    term = TermKey.of_spread(spreading.spread_constraints[0], "default")
    assert dict(graph.term_counts(term).by_domain) == {"z1": 1}
    affinity = TermKey.of_affinity(
        make_pod("t").pod_affinity("zone", {"app": "web"}).build().required_affinity[0]
    )
    assert dict(graph.term_counts(affinity).by_domain) == {"z1": 2}  # terminating counts

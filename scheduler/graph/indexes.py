"""Indexes derived from the affinity graph, kept in step by observing each patch operation.

Theory of operation. The graph is the truth; these dictionaries answer the scheduler's
questions without walking it. Each is updated from the operation being applied, reading
only the operation and the vertex's immediate neighbourhood, so the cost of a patch is
proportional to its size, and *any* patch (an event's, a diff, an inverse) keeps them right:

* ``match_node[t]`` / ``match_domain[t]``: placed pods with a ``matches`` edge to term
  ``t``, per node name and per value of ``t``'s topology key (the domain). A pod counts
  while it has a ``placed`` edge; a domain while its node has the ``in`` edge to it.
* ``declared[t][(kind, weight)]``: placed pods declaring ``t`` (affinity kinds only), per
  domain of ``t``'s key on their node — existing pods' terms, aggregated per distinct term.
* lookups the event handlers need: bound pods by label / key / namespace / assigned node,
  the node a pod is placed on, each node's domains, terms by anchor, declaration counts.

Zero counts are deleted, so two index sets with the same content compare equal.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, Final

from scheduler.graph.delta import Attrs
from scheduler.graph.terms import AnchorIndex, TermKey

POD: Final = "pod/"
NODE: Final = "node/"
DOMAIN: Final = "domain/"
TERM: Final = "term/"
NAMESPACE: Final = "ns/"

PLACED: Final = "placed"
IN: Final = "in"
MATCHES: Final = "matches"
DECLARES: Final = "declares"
SPREAD: Final = "spread"

DeclKind = tuple[str, int]
"""(declaration kind, weight), e.g. ("required-anti-affinity", 0)."""


def _bump(counter: dict[str, int], key: str, delta: int) -> None:
    value = counter.get(key, 0) + delta
    if value:
        counter[key] = value
    else:
        del counter[key]


def _add(index: dict[Any, set[str]], key: Any, member: str) -> None:
    bucket = index.get(key)
    if bucket is None:
        index[key] = {member}
    else:
        bucket.add(member)


def _discard(index: dict[Any, set[str]], key: Any, member: str) -> None:
    bucket = index.get(key)
    if bucket is not None:
        bucket.discard(member)
        if not bucket:
            del index[key]


class Indexes:
    """The observer of an affinity graph's patches (see the module docstring)."""

    def __init__(self, graph: Any) -> None:
        self._g = graph
        self.terms: dict[str, TermKey] = {}
        self.anchors = AnchorIndex()
        self.ns_sensitive: set[str] = set()
        self.declarers: Counter[str] = Counter()
        self.namespace_labels: dict[str, Mapping[str, str]] = {}
        self.pod_by_name: dict[tuple[str, str], set[str]] = {}
        """(namespace, name) -> pod vertices (two while a recreated pod's old UID lingers)."""
        self.bound: set[str] = set()
        self.bound_by_label: dict[tuple[str, str], set[str]] = {}
        self.bound_by_key: dict[str, set[str]] = {}
        self.bound_by_namespace: dict[str, set[str]] = {}
        self.assigned: dict[str, set[str]] = {}
        """Node name -> bound pods naming it (whether or not the node is known)."""
        self.placed_on: dict[str, str] = {}
        """Pod vertex -> node name, for pods with a ``placed`` edge."""
        self.node_domains: dict[str, dict[str, str]] = {}
        self.match_node: dict[str, dict[str, int]] = {}
        self.match_domain: dict[str, dict[str, int]] = {}
        self.declared: dict[str, dict[DeclKind, dict[str, int]]] = {}

    # ------------------------------------------------------------------ vertices
    def vertex_added(self, vertex: str, attrs: Attrs) -> None:
        kind = attrs["kind"]
        if kind == "pod":
            self._index_pod(vertex, attrs)
        elif kind == "term":
            term: TermKey = attrs["term"]
            self.terms[vertex] = term
            self.anchors.add(term)
            if term.ns_sensitive:
                self.ns_sensitive.add(vertex)
        elif kind == "node":
            self.node_domains[attrs["name"]] = {}
        elif kind == "ns":
            self.namespace_labels[attrs["name"]] = attrs["labels"]

    def vertex_removing(self, vertex: str, attrs: Attrs) -> None:
        kind = attrs["kind"]
        if kind == "pod":
            self._unindex_pod(vertex, attrs)
        elif kind == "term":
            term = self.terms.pop(vertex)
            self.anchors.discard(term)
            self.ns_sensitive.discard(vertex)
        elif kind == "node":
            del self.node_domains[attrs["name"]]
        elif kind == "ns":
            del self.namespace_labels[attrs["name"]]

    def attrs_changed(self, vertex: str, old: Attrs, new: Attrs) -> None:
        # A node's domains live on its edges, so its attributes carry no index state.
        if old["kind"] != "node" or new["kind"] != "node":
            self.vertex_removing(vertex, old)
            self.vertex_added(vertex, new)

    def _index_pod(self, vertex: str, attrs: Attrs) -> None:
        _add(self.pod_by_name, (attrs["namespace"], attrs["name"]), vertex)
        node = attrs["node"]
        if not node:
            return
        self.bound.add(vertex)
        for item in attrs["labels"].items():
            _add(self.bound_by_label, item, vertex)
            _add(self.bound_by_key, item[0], vertex)
        _add(self.bound_by_namespace, attrs["namespace"], vertex)
        _add(self.assigned, node, vertex)

    def _unindex_pod(self, vertex: str, attrs: Attrs) -> None:
        _discard(self.pod_by_name, (attrs["namespace"], attrs["name"]), vertex)
        node = attrs["node"]
        if not node:
            return
        self.bound.discard(vertex)
        for item in attrs["labels"].items():
            _discard(self.bound_by_label, item, vertex)
            _discard(self.bound_by_key, item[0], vertex)
        _discard(self.bound_by_namespace, attrs["namespace"], vertex)
        _discard(self.assigned, node, vertex)

    # --------------------------------------------------------------------- edges
    def edge_added(self, source: str, target: str, key: str, attrs: Attrs) -> None:
        self._edge(source, target, key, attrs, +1)

    def edge_removing(self, source: str, target: str, key: str, attrs: Attrs) -> None:
        self._edge(source, target, key, attrs, -1)

    def _edge(self, source: str, target: str, key: str, attrs: Attrs, sign: int) -> None:
        rel = attrs["rel"]
        if rel == PLACED:
            node = target[len(NODE) :]
            if sign > 0:
                self.placed_on[source] = node
            domains = self.node_domains[node]
            for t, keyed in self._g._adj[source].items():
                term = self.terms.get(t)
                if term is not None:
                    value = domains.get(term.topology_key)
                    for a in keyed.values():
                        self._count(t, a, node, value, sign)
            if sign < 0:
                del self.placed_on[source]
        elif rel == IN:
            node = source[len(NODE) :]
            domain = self._g._node[target]
            topology_key, value = domain["key"], domain["value"]
            if sign > 0:
                self.node_domains[node][topology_key] = value
            for pod in self._g._pred[node_vid(node)]:
                for t, keyed in self._g._adj[pod].items():
                    term = self.terms.get(t)
                    if term is not None and term.topology_key == topology_key:
                        for a in keyed.values():
                            self._count(t, a, None, value, sign)
            if sign < 0:
                del self.node_domains[node][topology_key]
        else:
            if rel == DECLARES:
                self.declarers[target] += sign
                if not self.declarers[target]:
                    del self.declarers[target]
            node_name = self.placed_on.get(source)
            if node_name is not None:
                value = self.node_domains[node_name].get(self.terms[target].topology_key)
                self._count(target, attrs, node_name, value, sign)

    def _count(
        self, term: str, attrs: Attrs, node: str | None, value: str | None, sign: int
    ) -> None:
        """Count one pod-term edge of a placed pod on ``node`` (None: domain part only)."""
        if attrs["rel"] == MATCHES:
            if node is not None:
                per_node = self.match_node.get(term)
                if per_node is None:
                    per_node = self.match_node[term] = {}
                _bump(per_node, node, sign)
                if not per_node:
                    del self.match_node[term]
            if value is not None:
                per_domain = self.match_domain.get(term)
                if per_domain is None:
                    per_domain = self.match_domain[term] = {}
                _bump(per_domain, value, sign)
                if not per_domain:
                    del self.match_domain[term]
        elif value is not None and attrs["kind"] != SPREAD:
            by_kind = self.declared.get(term)
            if by_kind is None:
                by_kind = self.declared[term] = {}
            decl = (attrs["kind"], attrs["weight"])
            counts = by_kind.get(decl)
            if counts is None:
                counts = by_kind[decl] = {}
            _bump(counts, value, sign)
            if not counts:
                del by_kind[decl]
                if not by_kind:
                    del self.declared[term]

    def view(self) -> dict[str, Any]:
        """The content of every index as plain values, for comparisons in tests."""
        return {
            "terms": dict(self.terms),
            "ns_sensitive": set(self.ns_sensitive),
            "declarers": dict(self.declarers),
            "namespace_labels": {k: dict(v) for k, v in self.namespace_labels.items()},
            "pod_by_name": {k: set(v) for k, v in self.pod_by_name.items()},
            "bound": set(self.bound),
            "bound_by_label": {k: set(v) for k, v in self.bound_by_label.items()},
            "bound_by_key": {k: set(v) for k, v in self.bound_by_key.items()},
            "bound_by_namespace": {k: set(v) for k, v in self.bound_by_namespace.items()},
            "assigned": {k: set(v) for k, v in self.assigned.items()},
            "placed_on": dict(self.placed_on),
            "node_domains": {k: dict(v) for k, v in self.node_domains.items()},
            "match_node": {k: dict(v) for k, v in self.match_node.items()},
            "match_domain": {k: dict(v) for k, v in self.match_domain.items()},
            "declared": {
                t: {d: dict(c) for d, c in by_kind.items()} for t, by_kind in self.declared.items()
            },
            "anchors": self.anchors.view(),
        }


def pod_vid(key: str) -> str:
    return POD + key


def node_vid(name: str) -> str:
    return NODE + name


def domain_vid(key: str, value: str) -> str:
    return f"{DOMAIN}{key}={value}"


def namespace_vid(name: str) -> str:
    return NAMESPACE + name

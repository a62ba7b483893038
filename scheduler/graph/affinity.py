"""The affinity graph: pods, nodes, topology domains, namespaces and affinity terms.

Theory of operation. Vertices are pods (``pod/<key>``), nodes (``node/<name>``), topology
domains (``domain/<key>=<value>``, one per node label), namespaces (``ns/<name>``) and
terms (``term/...``, one per distinct :class:`~scheduler.graph.terms.TermKey`). Edges:

* pod -> node ``placed`` (bound or assumed, and the node is known);
* node -> domain ``in``;
* pod -> term ``<kind>#<i>`` (rel ``declares``, with kind and weight) for each pod
  (anti-)affinity term and spread constraint the pod declares, pending pods included;
* pod -> term ``matches`` when the pod has a node (bound or assumed) and the term, as a
  term of a pod being scheduled, selects it (:func:`~scheduler.graph.terms.selects`).

There are no pod-pod edges: a selector matching thousands of pods costs one edge per pod.
A term vertex exists exactly while some pod declares it; a domain exactly while some node
carries it. So the graph is a function of the cluster state, and :meth:`AffinityGraph.build`
from a state equals the graph reached by any sequence of events ending in that state.

Each ``on_*`` method turns one event into a :class:`~scheduler.graph.delta.Patch` computed
from that event alone (the pod's own edges, new terms' matching pods found through the label
index, a node's domain edges) and applies it; :class:`~scheduler.graph.indexes.Indexes`
follow every operation. The queries read those indexes: per term, matching pods per node
and per domain; per term declared by placed pods, declarations per domain. A pod being
scheduled whose term has no vertex yet gets the same counts computed on the fly from the
label index (memoised until the next patch).

API for a cache: ``on_pod_placed(pod, node)`` (added, assumed, bound, moved or relabelled:
an upsert), ``on_pod_pending(pod)``, ``on_pod_removed(key)``, ``on_node_upserted(node)``,
``on_node_removed(name)``, ``on_namespace(ns)``, ``on_namespace_removed(name)``; each
returns the applied patch. :class:`~scheduler.core.snapshot.Snapshot` owns one graph and
calls them itself. Queries for the plugins: :meth:`AffinityGraph.term_counts`,
:meth:`~AffinityGraph.count_selecting_all`, :meth:`~AffinityGraph.declared_selecting`,
:meth:`~AffinityGraph.selects_pod`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from scheduler.graph.delta import (
    AddEdge,
    AddVertex,
    Attrs,
    DeltaGraph,
    Op,
    Patch,
    RemoveEdge,
    RemoveVertex,
    SetAttrs,
)
from scheduler.graph.indexes import (
    DECLARES,
    IN,
    MATCHES,
    PLACED,
    SPREAD,
    Indexes,
    domain_vid,
    namespace_vid,
    node_vid,
    pod_vid,
)
from scheduler.graph.terms import AnchorIndex, Labels, TermKey, selected_by, selects
from scheduler.model.node import Namespace, Node
from scheduler.model.pod import Pod

REQUIRED_AFFINITY: Final = "required-affinity"
REQUIRED_ANTI_AFFINITY: Final = "required-anti-affinity"
PREFERRED_AFFINITY: Final = "preferred-affinity"
PREFERRED_ANTI_AFFINITY: Final = "preferred-anti-affinity"

_MATCHES_ATTRS: Final[Attrs] = MappingProxyType({"rel": MATCHES})
_PLACED_ATTRS: Final[Attrs] = MappingProxyType({"rel": PLACED})
_IN_ATTRS: Final[Attrs] = MappingProxyType({"rel": IN})
_NO_COUNTS: Final[Mapping[str, int]] = MappingProxyType({})
_TRANSIENT_LIMIT: Final = 256

EdgeKey = tuple[str, str]
"""(target vertex, edge key) of one out-edge of a pod."""


@dataclass(frozen=True, slots=True)
class TermCounts:
    """Placed pods a term selects: per node name and per value of its topology key."""

    by_node: Mapping[str, int]
    by_domain: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Declared:
    """Placed pods declaring ``term`` as ``kind`` with ``weight``, per domain of its key."""

    term: TermKey
    kind: str
    weight: int
    by_domain: Mapping[str, int]


def declarations(pod: Pod) -> Iterator[tuple[str, int, int, TermKey]]:
    """(kind, weight, position, term) for every term and spread constraint of ``pod``."""
    for i, t in enumerate(pod.required_affinity):
        yield REQUIRED_AFFINITY, 0, i, TermKey.of_affinity(t)
    for i, t in enumerate(pod.required_anti_affinity):
        yield REQUIRED_ANTI_AFFINITY, 0, i, TermKey.of_affinity(t)
    for i, w in enumerate(pod.preferred_affinity):
        yield PREFERRED_AFFINITY, w.weight, i, TermKey.of_affinity(w.term)
    for i, w in enumerate(pod.preferred_anti_affinity):
        yield PREFERRED_ANTI_AFFINITY, w.weight, i, TermKey.of_affinity(w.term)
    for i, c in enumerate(pod.spread_constraints):
        yield SPREAD, 0, i, TermKey.of_spread(c, pod.namespace)


def _frozen(labels: Mapping[str, str]) -> Mapping[str, str]:
    return labels if isinstance(labels, MappingProxyType) else MappingProxyType(dict(labels))


def pod_attrs(pod: Pod, node_name: str) -> dict[str, Any]:
    return {
        "kind": "pod",
        "namespace": pod.namespace,
        "name": pod.name,
        "labels": _frozen(pod.labels),
        "terminating": pod.terminating,
        "node": node_name,
    }


def term_attrs(term: TermKey) -> dict[str, Any]:
    return {"kind": "term", "term": term}


def _declares_attrs(kind: str, weight: int) -> dict[str, Any]:
    return {"rel": DECLARES, "kind": kind, "weight": weight}


class AffinityGraph:
    """One scheduler's affinity graph: events in, patches out, counts on demand."""

    def __init__(self) -> None:
        self._graph = DeltaGraph()
        self._idx = Indexes(self._graph.raw)
        self._graph.attach(self._idx)
        self._transient: dict[str, TermCounts] = {}
        self._transient_seq = -1

    # ------------------------------------------------------------------ reading
    @property
    def graph(self) -> DeltaGraph:
        return self._graph

    @property
    def indexes(self) -> Indexes:
        return self._idx

    @property
    def seq(self) -> int:
        return self._graph.seq

    def namespace_labels(self, namespace: str) -> Labels | None:
        return self._idx.namespace_labels.get(namespace)

    def term_counts(self, term: TermKey) -> TermCounts:
        """Placed pods ``term`` selects, per node and per domain (index or computed).

        The mappings are live index views: read them before the next patch.
        """
        vid = term.vid
        idx = self._idx
        if vid in idx.terms:
            return TermCounts(
                idx.match_node.get(vid, _NO_COUNTS), idx.match_domain.get(vid, _NO_COUNTS)
            )
        if self._transient_seq != self._graph.seq or len(self._transient) > _TRANSIENT_LIMIT:
            self._transient.clear()
            self._transient_seq = self._graph.seq
        counts = self._transient.get(vid)
        if counts is None:
            by_node: Counter[str] = Counter()
            by_domain: Counter[str] = Counter()
            for pod in self._selected_pods(term):
                node = idx.placed_on.get(pod)
                if node is None:
                    continue
                by_node[node] += 1
                value = idx.node_domains[node].get(term.topology_key)
                if value is not None:
                    by_domain[value] += 1
            counts = self._transient[vid] = TermCounts(by_node, by_domain)
        return counts

    def count_selecting_all(self, terms: Sequence[TermKey]) -> list[Counter[str]]:
        """For placed pods selected by *every* term: per term, pods per domain of its key
        (kube's required-affinity counting, where one pod must satisfy all terms)."""
        out: list[Counter[str]] = [Counter() for _ in terms]
        if not terms:
            return out
        sets = sorted((self._selected_pods(t) for t in terms), key=len)
        common = set(sets[0]).intersection(*sets[1:])
        idx = self._idx
        for pod in common:
            node = idx.placed_on.get(pod)
            if node is None:
                continue
            domains = idx.node_domains[node]
            for term, counts in zip(terms, out, strict=True):
                value = domains.get(term.topology_key)
                if value is not None:
                    counts[value] += 1
        return out

    def declared_selecting(self, pod: Pod, kinds: frozenset[str]) -> list[Declared]:
        """Terms of placed pods, declared as one of ``kinds``, that select ``pod``."""
        idx = self._idx
        declared = idx.declared
        candidates = idx.anchors.candidates(pod.labels)
        pool: Iterable[str] = candidates if len(candidates) < len(declared) else declared
        ns_labels = idx.namespace_labels.get(pod.namespace)
        out: list[Declared] = []
        for vid in pool:
            by_kind = declared.get(vid)
            if not by_kind or not any(k in kinds for k, _ in by_kind):
                continue
            term = idx.terms[vid]
            if not selected_by(term, pod.namespace, pod.labels, ns_labels):
                continue
            for (kind, weight), counts in by_kind.items():
                if kind in kinds:
                    out.append(Declared(term, kind, weight, counts))
        return out

    def selects_pod(self, term: TermKey, pod: Pod) -> bool:
        """Whether a term (of a pod being scheduled) selects ``pod`` — e.g. the pod itself."""
        ns_labels = self._idx.namespace_labels.get(pod.namespace)
        return selects(term, pod.namespace, pod.labels, ns_labels, pod.terminating)

    def find_pod(self, namespace: str, name: str) -> str | None:
        """The vertex of a pod by namespace and name (the bound one if its name is doubled)."""
        found = self._idx.pod_by_name.get((namespace, name))
        if not found:
            return None
        return min(found, key=lambda v: (v not in self._idx.bound, v))

    def _selected_pods(self, term: TermKey) -> set[str]:
        idx = self._idx
        if term.vid in idx.terms:
            pred = self._graph.raw._pred[term.vid]
            return {p for p, keyed in pred.items() if MATCHES in keyed}
        g = self._graph.raw
        out = set()
        for pod in self._bound_candidates(term):
            a = g._node[pod]
            ns_labels = idx.namespace_labels.get(a["namespace"])
            if selects(term, a["namespace"], a["labels"], ns_labels, a["terminating"]):
                out.add(pod)
        return out

    def _bound_candidates(self, term: TermKey) -> set[str]:
        """Bound pods that might be selected by ``term``: its anchor, narrowed by namespace."""
        idx = self._idx
        if term.never:
            return set()
        by_label: set[str] | None = None
        if term.anchor is not None:
            key, values = term.anchor
            if values:
                by_label = set()
                for value in values:
                    by_label |= idx.bound_by_label.get((key, value), set())
            else:
                by_label = set(idx.bound_by_key.get(key, ()))
        by_ns: set[str] | None = None
        if term.spread or term.namespace_selector.selects_nothing:
            by_ns = set()
            for ns in term.namespaces:
                by_ns |= idx.bound_by_namespace.get(ns, set())
        if by_label is None and by_ns is None:
            return set(idx.bound)
        if by_label is None or (by_ns is not None and len(by_ns) < len(by_label)):
            assert by_ns is not None
            return by_ns
        return by_label

    # ------------------------------------------------------------------- events
    def on_pod_placed(self, pod: Pod, node_name: str) -> Patch:
        """A pod bound or assumed to ``node_name`` (added, moved, or its labels changed)."""
        if not node_name:
            raise ValueError(f"pod {pod.key}: placing needs a node name")
        return self._commit(self._upsert_pod(pod, node_name))

    def on_pod_pending(self, pod: Pod) -> Patch:
        """A pod not placed yet: its terms get vertices, so its siblings' queries are indexed."""
        return self._commit(self._upsert_pod(pod, ""))

    def on_pod_removed(self, key: str) -> Patch:
        return self._commit(self._remove_pod(pod_vid(key)))

    def on_node_upserted(self, node: Node) -> Patch:
        return self._commit(self._upsert_node(node))

    def on_node_removed(self, name: str) -> Patch:
        """The node goes; its pods stay, waiting for a node of that name (like the snapshot)."""
        return self._commit(self._remove_node(name))

    def on_namespace(self, namespace: Namespace) -> Patch:
        return self._commit(self._set_namespace(namespace.name, _frozen(namespace.labels)))

    def on_namespace_removed(self, name: str) -> Patch:
        return self._commit(self._set_namespace(name, None))

    def apply(self, patch: Patch) -> bool:
        """Apply a patch from elsewhere (a replica, an undo); False if already applied."""
        return self._graph.apply(patch)

    def _commit(self, ops: list[Op]) -> Patch:
        patch = Patch(self._graph.seq + 1, tuple(ops))
        self._graph.apply(patch)
        return patch

    # ----------------------------------------------------------- pod patches
    def _current_edges(self, vertex: str) -> dict[EdgeKey, Attrs]:
        g = self._graph.raw
        if vertex not in g._node:
            return {}
        return {(v, k): a for v, keyed in g._adj[vertex].items() for k, a in keyed.items()}

    def _orphaned_terms(
        self, current: Mapping[EdgeKey, Attrs], declared_after: Counter[str]
    ) -> list[str]:
        """Terms whose last declarations are the ones this pod drops."""
        dropped: Counter[str] = Counter(v for (v, _), a in current.items() if a["rel"] == DECLARES)
        return [
            t
            for t, n in dropped.items()
            if self._idx.declarers[t] - n + declared_after.get(t, 0) == 0
        ]

    def _drop_terms(self, terms: Iterable[str], pod: str, ops: list[Op]) -> None:
        """Remove orphaned term vertices with the edges other pods still have to them."""
        g = self._graph.raw
        for t in terms:
            for other, keyed in g._pred[t].items():
                if other != pod:
                    for k, a in keyed.items():
                        ops.append(RemoveEdge(other, t, k, a))
            ops.append(RemoveVertex(t, dict(g._node[t])))

    def _upsert_pod(self, pod: Pod, node_name: str) -> list[Op]:
        g, idx = self._graph.raw, self._idx
        p = pod_vid(pod.key)
        attrs = pod_attrs(pod, node_name)
        old_attrs = g._node.get(p)
        desired: dict[EdgeKey, Attrs] = {}
        new_terms: dict[str, TermKey] = {}
        declared_after: Counter[str] = Counter()
        for kind, weight, i, term in declarations(pod):
            desired[(term.vid, f"{kind}#{i}")] = _declares_attrs(kind, weight)
            declared_after[term.vid] += 1
            if term.vid not in idx.terms:
                new_terms[term.vid] = term
        current = self._current_edges(p)
        orphaned = self._orphaned_terms(current, declared_after)
        if node_name:
            ns_labels = idx.namespace_labels.get(pod.namespace)
            dropped = set(orphaned)
            for t in idx.anchors.candidates(pod.labels) | new_terms.keys():
                term = idx.terms.get(t) or new_terms[t]
                if t not in dropped and selects(
                    term, pod.namespace, pod.labels, ns_labels, pod.terminating
                ):
                    desired[(t, MATCHES)] = _MATCHES_ATTRS
            if node_vid(node_name) in g._node:
                desired[(node_vid(node_name), PLACED)] = _PLACED_ATTRS

        ops: list[Op] = []
        for (v, k), a in current.items():
            if desired.get((v, k)) != a:
                ops.append(RemoveEdge(p, v, k, a))
        self._drop_terms(orphaned, p, ops)
        if old_attrs is None:
            ops.append(AddVertex(p, attrs))
        elif old_attrs != attrs:
            ops.append(SetAttrs(p, dict(old_attrs), attrs))
        for t, term in new_terms.items():
            ops.append(AddVertex(t, term_attrs(term)))
            for q in self._bound_candidates(term):
                if q == p:
                    continue
                a = g._node[q]
                ns_labels = idx.namespace_labels.get(a["namespace"])
                if selects(term, a["namespace"], a["labels"], ns_labels, a["terminating"]):
                    ops.append(AddEdge(q, t, MATCHES, _MATCHES_ATTRS))
        for (v, k), a in desired.items():
            if current.get((v, k)) != a:
                ops.append(AddEdge(p, v, k, a))
        return ops

    def _remove_pod(self, p: str) -> list[Op]:
        g = self._graph.raw
        if p not in g._node:
            return []
        current = self._current_edges(p)
        ops: list[Op] = [RemoveEdge(p, v, k, a) for (v, k), a in current.items()]
        self._drop_terms(self._orphaned_terms(current, Counter()), p, ops)
        ops.append(RemoveVertex(p, dict(g._node[p])))
        return ops

    # ---------------------------------------------------------- node patches
    def _upsert_node(self, node: Node) -> list[Op]:
        g, idx = self._graph.raw, self._idx
        n = node_vid(node.name)
        ops: list[Op] = []
        exists = n in g._node
        current = set(g._adj[n]) if exists else set()
        desired = {domain_vid(k, v): (k, v) for k, v in node.labels.items()}
        if not exists:
            ops.append(AddVertex(n, {"kind": "node", "name": node.name}))
        for d in current - desired.keys():
            ops.append(RemoveEdge(n, d, IN, g._adj[n][d][IN]))
            if len(g._pred[d]) == 1:
                ops.append(RemoveVertex(d, dict(g._node[d])))
        for d, (k, v) in desired.items():
            if d in current:
                continue
            if d not in g._node:
                ops.append(AddVertex(d, {"kind": "domain", "key": k, "value": v}))
            ops.append(AddEdge(n, d, IN, _IN_ATTRS))
        if not exists:
            for p in sorted(idx.assigned.get(node.name, ())):
                ops.append(AddEdge(p, n, PLACED, _PLACED_ATTRS))
        return ops

    def _remove_node(self, name: str) -> list[Op]:
        g = self._graph.raw
        n = node_vid(name)
        if n not in g._node:
            return []
        ops: list[Op] = []
        for p, keyed in g._pred[n].items():
            for k, a in keyed.items():
                ops.append(RemoveEdge(p, n, k, a))
        for d, keyed in g._adj[n].items():
            for k, a in keyed.items():
                ops.append(RemoveEdge(n, d, k, a))
            if len(g._pred[d]) == 1:
                ops.append(RemoveVertex(d, dict(g._node[d])))
        ops.append(RemoveVertex(n, dict(g._node[n])))
        return ops

    # ----------------------------------------------------- namespace patches
    def _set_namespace(self, name: str, labels: Labels | None) -> list[Op]:
        g, idx = self._graph.raw, self._idx
        v = namespace_vid(name)
        old = g._node.get(v)
        ops: list[Op] = []
        if labels is None:
            if old is None:
                return []
            ops.append(RemoveVertex(v, dict(old)))
        else:
            attrs = {"kind": "ns", "name": name, "labels": labels}
            if old is None:
                ops.append(AddVertex(v, attrs))
            elif old != attrs:
                ops.append(SetAttrs(v, dict(old), attrs))
            else:
                return []
        # Terms with a namespace selector may now select pods of this namespace, or not.
        sensitive = sorted(idx.ns_sensitive)
        for p in sorted(idx.bound_by_namespace.get(name, ())) if sensitive else ():
            a = g._node[p]
            for t in sensitive:
                want = selects(idx.terms[t], name, a["labels"], labels, a["terminating"])
                have = MATCHES in g._adj[p].get(t, {})
                if want and not have:
                    ops.append(AddEdge(p, t, MATCHES, _MATCHES_ATTRS))
                elif have and not want:
                    ops.append(RemoveEdge(p, t, MATCHES, g._adj[p][t][MATCHES]))
        return ops

    # ------------------------------------------------------------- from scratch
    @classmethod
    def build(
        cls,
        nodes: Iterable[Node],
        placed: Iterable[tuple[Pod, str]],
        namespaces: Iterable[Namespace] = (),
        pending: Iterable[Pod] = (),
    ) -> AffinityGraph:
        """The graph of a cluster state, computed directly (no events) and loaded as one patch.

        This is the full rebuild the incremental path avoids; tests compare the two.
        """
        ops: list[Op] = []
        ns_labels: dict[str, Labels] = {}
        for ns in namespaces:
            ns_labels[ns.name] = _frozen(ns.labels)
        for name, labels in ns_labels.items():
            ops.append(
                AddVertex(namespace_vid(name), {"kind": "ns", "name": name, "labels": labels})
            )
        node_names: set[str] = set()
        domains: dict[str, tuple[str, str]] = {}
        node_edges: list[Op] = []
        for node in nodes:
            node_names.add(node.name)
            ops.append(AddVertex(node_vid(node.name), {"kind": "node", "name": node.name}))
            for k, v in node.labels.items():
                domains.setdefault(domain_vid(k, v), (k, v))
                node_edges.append(AddEdge(node_vid(node.name), domain_vid(k, v), IN, _IN_ATTRS))
        for d, (k, v) in domains.items():
            ops.append(AddVertex(d, {"kind": "domain", "key": k, "value": v}))
        ops.extend(node_edges)
        pods: dict[str, tuple[Pod, str]] = {}
        for pod in pending:
            pods[pod.key] = (pod, "")
        for pod, node_name in placed:
            pods[pod.key] = (pod, node_name)
        terms: dict[str, TermKey] = {}
        pod_edges: list[Op] = []
        for pod, node_name in pods.values():
            p = pod_vid(pod.key)
            ops.append(AddVertex(p, pod_attrs(pod, node_name)))
            for kind, weight, i, term in declarations(pod):
                terms.setdefault(term.vid, term)
                pod_edges.append(AddEdge(p, term.vid, f"{kind}#{i}", _declares_attrs(kind, weight)))
            if node_name in node_names:
                pod_edges.append(AddEdge(p, node_vid(node_name), PLACED, _PLACED_ATTRS))
        for t, term in terms.items():
            ops.append(AddVertex(t, term_attrs(term)))
        anchors = AnchorIndex()
        for term in terms.values():
            anchors.add(term)
        for pod, node_name in pods.values():
            if not node_name:
                continue
            known = ns_labels.get(pod.namespace)
            for t in anchors.candidates(pod.labels):
                if selects(terms[t], pod.namespace, pod.labels, known, pod.terminating):
                    pod_edges.append(AddEdge(pod_vid(pod.key), t, MATCHES, _MATCHES_ATTRS))
        ops.extend(pod_edges)
        graph = cls()
        graph._commit(ops)
        return graph

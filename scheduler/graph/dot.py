"""DOT export of the affinity graph, and the neighbourhoods that explain a placement.

Theory of operation. A placement is explained by a short path: the pod declares a term, the
term matches (or is declared by) other pods, those pods are placed on nodes, and the nodes
sit in the term's topology domains. :func:`pod_view` walks that many steps from one pod;
:func:`namespace_view` takes a namespace's pods with their terms and nodes. Two rules keep
the picture readable on a real cluster: domain vertices are never walked through (a zone
reaches every node in it) and are kept only for topology keys of the terms shown, and each
vertex contributes at most ``max_fanout`` neighbours (the rest are counted in a "+N more"
box). :func:`to_dot` renders any vertex set deterministically (sorted), so two exports of the
same graph diff cleanly.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from scheduler.graph.affinity import AffinityGraph
from scheduler.graph.delta import Attrs, DeltaGraph
from scheduler.graph.indexes import DECLARES, MATCHES, PLACED, namespace_vid
from scheduler.graph.terms import TermKey

DEFAULT_FANOUT: Final = 25
_SHAPES: Final = {
    "pod": "ellipse",
    "node": "box",
    "domain": "hexagon",
    "term": "note",
    "ns": "folder",
}
_COLOURS: Final = {
    "required-affinity": "darkgreen",
    "preferred-affinity": "green3",
    "required-anti-affinity": "red3",
    "preferred-anti-affinity": "orange3",
    "spread": "blue3",
}


@dataclass
class View:
    """A vertex selection, and per vertex how many neighbours were left out."""

    vertices: set[str] = field(default_factory=set)
    truncated: dict[str, int] = field(default_factory=dict)


def _quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _labels_text(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def vertex_label(attrs: Attrs) -> str:
    kind = attrs["kind"]
    if kind == "pod":
        head = f"{attrs['namespace']}/{attrs['name']}"
        state = []
        if not attrs["node"]:
            state.append("pending")
        if attrs["terminating"]:
            state.append("terminating")
        tail = f" ({', '.join(state)})" if state else ""
        return f"{head}{tail}\n{_labels_text(attrs['labels'])}".rstrip("\n")
    if kind == "node":
        return str(attrs["name"])
    if kind == "domain":
        return f"{attrs['key']}={attrs['value']}"
    if kind == "term":
        term: TermKey = attrs["term"]
        body, _, key = term.vid.removeprefix("term/").rpartition(" @ ")
        return f"{body}\n@ {key}"
    return f"namespace {attrs['name']}\n{_labels_text(attrs['labels'])}".rstrip("\n")


def to_dot(
    graph: DeltaGraph,
    vertices: Collection[str] | None = None,
    *,
    truncated: Mapping[str, int] | None = None,
    name: str = "lattice",
) -> str:
    """DOT text of the subgraph induced by ``vertices`` (the whole graph when None)."""
    g = graph.raw
    chosen = set(g._node) if vertices is None else set(vertices) & set(g._node)
    lines = [
        f"digraph {_quote(name)} {{",
        "  rankdir=LR;",
        '  node [fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=9];',
    ]
    for v in sorted(chosen):
        attrs = g._node[v]
        style = ""
        if attrs["kind"] == "pod" and not attrs["node"]:
            style = ", style=dashed"
        lines.append(
            f"  {_quote(v)} [label={_quote(vertex_label(attrs))}, "
            f"shape={_SHAPES.get(attrs['kind'], 'ellipse')}{style}];"
        )
    for v in sorted(chosen):
        for target in sorted(g._adj[v]):
            if target not in chosen:
                continue
            for key, attrs in sorted(g._adj[v][target].items()):
                lines.append(f"  {_quote(v)} -> {_quote(target)} [{_edge_style(key, attrs)}];")
    for v, count in sorted((truncated or {}).items()):
        if v in chosen and count > 0:
            more = f"{v} +more"
            lines.append(f"  {_quote(more)} [label={_quote(f'+{count} more')}, shape=plaintext];")
            lines.append(f"  {_quote(v)} -> {_quote(more)} [style=dotted, arrowhead=none];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _edge_style(key: str, attrs: Attrs) -> str:
    rel = attrs["rel"]
    if rel == DECLARES:
        kind = attrs["kind"]
        label = kind if not attrs["weight"] else f"{kind} w={attrs['weight']}"
        return f"label={_quote(label)}, color={_COLOURS.get(kind, 'black')}"
    if rel == MATCHES:
        return f"label={_quote('matches')}, style=dashed, color=gray40"
    if rel == PLACED:
        return "label=placed, style=bold"
    return "style=dotted, color=gray60, arrowhead=none"


def _neighbours(g: Any, v: str) -> list[str]:
    if g._node[v]["kind"] == "domain":
        return []  # hubs: a zone would pull in every node it holds
    return sorted(set(g._adj[v]) | set(g._pred[v]))


def _keep_relevant_domains(g: Any, view: View) -> View:
    keys = {g._node[v]["term"].topology_key for v in view.vertices if g._node[v]["kind"] == "term"}
    view.vertices = {
        v for v in view.vertices if g._node[v]["kind"] != "domain" or g._node[v]["key"] in keys
    }
    return view


def pod_view(
    graph: AffinityGraph, pod_vertex: str, depth: int = 2, *, max_fanout: int = DEFAULT_FANOUT
) -> View:
    """Vertices within ``depth`` steps of a pod (edges taken both ways), the nodes of the
    pods shown, the pod's namespace, and the nodes' domains for the shown terms' keys."""
    g = graph.graph.raw
    if pod_vertex not in g._node:
        raise LookupError(f"no pod vertex {pod_vertex!r}")
    view = View({pod_vertex})
    frontier = [pod_vertex]
    for _ in range(depth):
        nxt: list[str] = []
        for v in frontier:
            fresh = [u for u in _neighbours(g, v) if u not in view.vertices]
            if len(fresh) > max_fanout:
                view.truncated[v] = len(fresh) - max_fanout
                fresh = fresh[:max_fanout]
            view.vertices.update(fresh)
            nxt.extend(fresh)
        frontier = nxt
    # Where every shown pod runs, and the domains of those nodes, are leaves of the picture.
    for v in list(view.vertices):
        if g._node[v]["kind"] == "pod":
            view.vertices.update(u for u in g._adj[v] if g._node[u]["kind"] == "node")
    for v in list(view.vertices):
        if g._node[v]["kind"] == "node":
            view.vertices.update(g._adj[v])
    ns = namespace_vid(g._node[pod_vertex]["namespace"])
    if ns in g._node:
        view.vertices.add(ns)
    return _keep_relevant_domains(g, view)


def namespace_view(
    graph: AffinityGraph, namespace: str, *, max_fanout: int = DEFAULT_FANOUT
) -> View:
    """A namespace's pods with their nodes and terms, the pods elsewhere that declare or
    match those terms (with their nodes), and the nodes' domains for the terms' keys."""
    g = graph.graph.raw
    view = View()
    if namespace_vid(namespace) in g._node:
        view.vertices.add(namespace_vid(namespace))
    own = {p for (ns, _), ps in graph.indexes.pod_by_name.items() if ns == namespace for p in ps}
    terms = {t for p in own for t in g._adj[p] if g._node[t]["kind"] == "term"}
    others: set[str] = set()
    for t in sorted(terms):
        related = sorted(u for u in g._pred[t] if u not in own)
        if len(related) > max_fanout:
            view.truncated[t] = len(related) - max_fanout
            related = related[:max_fanout]
        others.update(related)
    view.vertices |= own | terms | others
    for p in own | others:
        for v in g._adj[p]:
            if g._node[v]["kind"] == "node":
                view.vertices.add(v)
                view.vertices.update(g._adj[v])
    return _keep_relevant_domains(g, view)

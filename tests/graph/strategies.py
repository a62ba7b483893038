"""Hypothesis strategies: small clusters and event sequences over few labels, so that terms,
selectors and domains collide often (shared term vertices, emptied domains, orphaned terms).

Pods are built through the API-shaped builders, so parsing (matchLabelKeys merging, default
namespaces of terms) is part of every example; each pod comes from one drawn seed, which
keeps generation cheap on a shared machine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from scheduler.core.snapshot import Snapshot
from scheduler.model.names import LABEL_HOSTNAME
from scheduler.model.node import Namespace, Node
from scheduler.model.pod import Pod
from tests.builders import PodBuilder, expr, make_namespace, make_node, make_pod

NODE_NAMES = ("n0", "n1", "n2", "n3", "n4")
NAMESPACES = ("default", "ns1", "ns2")
APPS = ("web", "db", "cache")
TOPOLOGY_KEYS = ("zone", "rack", LABEL_HOSTNAME)
UIDS = tuple(f"u{i}" for i in range(12))

Body = dict[str, Any]

SELECTORS: tuple[Body, ...] = (
    {"labels": {"app": "web"}},
    {"labels": {"app": "db"}},
    {"expressions": [expr("app", "In", "web", "cache")]},
    {"expressions": [expr("app", "NotIn", "db")]},
    {"expressions": [expr("tier", "Exists")]},
    {"expressions": [expr("tier", "DoesNotExist")]},
    {"labels": {"app": "web"}, "expressions": [expr("tier", "In", "a")]},
    {},
)
NAMESPACE_CHOICES: tuple[Body, ...] = (
    {},
    {},
    {"namespaces": ["ns1"]},
    {"namespaces": ["default", "ns2"]},
    {"namespace_selector": {}},
    {"namespace_selector": {"matchLabels": {"team": "a"}}},
    {"namespace_selector": {"matchExpressions": [expr("team", "NotIn", "b")]}},
    {"namespace_selector": {"matchExpressions": [expr("team", "Exists")]}},
)


def _terms(r: random.Random, builder: PodBuilder) -> None:
    for _ in range(r.randint(0, 3)):
        kind = r.choice(["aff", "anti", "paff", "panti"])
        sel = r.choice(SELECTORS)
        extra: dict[str, Any] = dict(r.choice(NAMESPACE_CHOICES))
        if r.randint(0, 5) == 0:
            extra["match_label_keys"] = ["tier"]
        builder.pod_affinity(
            r.choice(TOPOLOGY_KEYS),
            sel.get("labels"),
            expressions=sel.get("expressions", ()),
            anti=kind in ("anti", "panti"),
            weight=r.randint(1, 100) if kind in ("paff", "panti") else None,
            **extra,
        )
    for _ in range(r.randint(0, 2)):
        sel = r.choice(SELECTORS)
        options: dict[str, Any] = {}
        if r.randint(0, 9) == 0:
            options["null_selector"] = True
        if r.randint(0, 3) == 0:
            options["min_domains"] = r.randint(1, 4)
        if r.randint(0, 3) == 0:
            options["node_affinity_policy"] = r.choice(["Honor", "Ignore"])
        if r.randint(0, 3) == 0:
            options["node_taints_policy"] = r.choice(["Honor", "Ignore"])
        if r.randint(0, 5) == 0:
            options["match_label_keys"] = ["tier"]
        builder.spread(
            r.randint(1, 2),
            r.choice(TOPOLOGY_KEYS),
            sel.get("labels"),
            expressions=sel.get("expressions", ()),
            hard=r.random() < 0.5,
            **options,
        )


def random_pod(r: random.Random, uid: str, name: str | None = None) -> Pod:
    """A pod drawn from few labels and terms, so that they collide across pods (names too:
    a recreated pod can briefly exist under two UIDs)."""
    namespace = r.choice(("default", "default", "default", *NAMESPACES[1:]))
    builder = make_pod(name or f"pod-{uid[-1]}", namespace=namespace).uid(uid)
    if r.randint(0, 4):
        builder.label("app", r.choice(APPS))
    if r.random() < 0.5:
        builder.label("tier", r.choice(["a", "b"]))
    if r.randint(0, 7) == 0:
        builder.terminating()
    if r.randint(0, 3) == 0:
        builder.node_affinity_in("zone", r.choice(["z1", "z2"]))
    if r.randint(0, 3) == 0:
        builder.toleration("dedicated", "x", "NoSchedule")
    _terms(r, builder)
    return builder.build()


@st.composite
def pods(draw: st.DrawFn, *, uid: str | None = None, name: str | None = None) -> Pod:
    """A random pod; one seed draw instead of dozens keeps generation cheap (the event
    lists around it still shrink)."""
    uid = uid or draw(st.sampled_from(UIDS))
    return random_pod(random.Random(draw(st.integers(0, 2**32 - 1))), uid, name)


@st.composite
def nodes(draw: st.DrawFn, name: str | None = None) -> Node:
    name = name or draw(st.sampled_from(NODE_NAMES))
    builder = make_node(name)
    if draw(st.integers(0, 5)):
        builder.label("zone", draw(st.sampled_from(["z1", "z2", "z3"])))
    if draw(st.booleans()):
        builder.label("rack", draw(st.sampled_from(["r1", "r2"])))
    if draw(st.integers(0, 7)) == 0:
        builder.without_label(LABEL_HOSTNAME)
    if draw(st.integers(0, 5)) == 0:
        builder.taint("dedicated", "x", "NoSchedule")
    return builder.build()


@st.composite
def namespaces(draw: st.DrawFn) -> Namespace:
    name = draw(st.sampled_from(NAMESPACES))
    team = draw(st.sampled_from([None, "a", "b"]))
    return make_namespace(name, **({"team": team} if team else {}))


_EVENT_KINDS = (
    *["node"] * 3,
    "rmnode",
    *["place"] * 12,
    *["pending"] * 2,
    *["rmpod"] * 2,
    *["ns"] * 2,
    "rmns",
)


@st.composite
def events(draw: st.DrawFn) -> tuple[Any, ...]:
    """One cluster event: what the controller would feed the snapshot or the graph."""
    kind = draw(st.sampled_from(_EVENT_KINDS))
    if kind == "node":
        return ("node", draw(nodes()))
    if kind == "rmnode":
        return ("rmnode", draw(st.sampled_from(NODE_NAMES)))
    if kind == "place":
        return ("place", draw(pods()), draw(st.sampled_from(NODE_NAMES)))
    if kind == "pending":
        return ("pending", draw(pods()))
    if kind == "rmpod":
        return ("rmpod", draw(st.sampled_from(UIDS)))
    if kind == "ns":
        return ("ns", draw(namespaces()))
    return ("rmns", draw(st.sampled_from(NAMESPACES)))


@dataclass
class Model:
    """The cluster state a sequence of events leads to, kept the plain way."""

    nodes: dict[str, Node] = field(default_factory=dict)
    pods: dict[str, tuple[Pod, str]] = field(default_factory=dict)
    namespaces: dict[str, Namespace] = field(default_factory=dict)

    def apply(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == "node":
            self.nodes[event[1].name] = event[1]
        elif kind == "rmnode":
            self.nodes.pop(event[1], None)
        elif kind == "place":
            self.pods[event[1].key] = (event[1], event[2])
        elif kind == "pending":
            self.pods[event[1].key] = (event[1], "")
        elif kind == "rmpod":
            self.pods.pop(event[1], None)
        elif kind == "ns":
            self.namespaces[event[1].name] = event[1]
        else:
            self.namespaces.pop(event[1], None)

    @property
    def placed(self) -> list[tuple[Pod, str]]:
        return [(p, n) for p, n in self.pods.values() if n]

    @property
    def pending(self) -> list[Pod]:
        return [p for p, n in self.pods.values() if not n]


def feed_snapshot(snapshot: Snapshot, event: tuple[Any, ...]) -> None:
    """The same events through the snapshot (pending pods go to its graph directly)."""
    kind = event[0]
    if kind == "node":
        snapshot.add_node(event[1])
    elif kind == "rmnode":
        snapshot.remove_node(event[1])
    elif kind == "place":
        snapshot.add_pod(event[1], event[2])
    elif kind == "pending":
        snapshot.remove_pod(event[1].key)
        snapshot.affinity_graph.on_pod_pending(event[1])
    elif kind == "rmpod":
        snapshot.remove_pod(event[1])
    elif kind == "ns":
        snapshot.set_namespace(event[1])
    else:
        snapshot.remove_namespace(event[1])


@st.composite
def event_lists(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """A few nodes and namespaces first (so placements count), then any events."""
    names = draw(st.lists(st.sampled_from(NODE_NAMES), min_size=1, max_size=5, unique=True))
    out: list[tuple[Any, ...]] = [("node", draw(nodes(name))) for name in names]
    out += [("ns", ns) for ns in draw(st.lists(namespaces(), max_size=2))]
    out += draw(st.lists(events(), min_size=10, max_size=40))
    return out


@st.composite
def dense_clusters(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """Events for a populated cluster: every node exists, most pods land on one, then churn."""
    names = draw(st.lists(st.sampled_from(NODE_NAMES), min_size=2, max_size=5, unique=True))
    out: list[tuple[Any, ...]] = [("node", draw(nodes(name))) for name in names]
    out += [("ns", ns) for ns in draw(st.lists(namespaces(), max_size=2))]
    for uid in draw(st.lists(st.sampled_from(UIDS), min_size=3, max_size=len(UIDS), unique=True)):
        out.append(("place", draw(pods(uid=uid)), draw(st.sampled_from(names))))
    out += draw(st.lists(events(), max_size=6))
    return out

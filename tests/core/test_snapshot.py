"""The columnar snapshot: incremental updates must equal a snapshot built from scratch."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.snapshot import Snapshot
from scheduler.model.node import Node
from scheduler.model.pod import Pod
from tests.builders import make_namespace, make_node, make_pod

NODE_NAMES = ("n0", "n1", "n2", "n3")


def view(snapshot: Snapshot) -> dict[str, Any]:
    """Everything the filters read, keyed by node name (row order is irrelevant)."""
    out: dict[str, Any] = {}
    resources = snapshot.resource_names
    for name in snapshot.node_names:
        i = snapshot.index_of(name)
        assert i is not None
        labels = {}
        for key in snapshot.label_keys():
            column = snapshot.label_column(key)
            assert column is not None
            vid = int(column.ids[i])
            if vid >= 0:
                labels[key] = column.values[vid]
        taints = {
            snapshot.taints[j] for j in range(len(snapshot.taints)) if snapshot.taint_matrix[i, j]
        }
        out[name] = {
            "alloc": {
                r: int(snapshot.allocatable[k, i])
                for k, r in enumerate(resources)
                if snapshot.allocatable[k, i]
            },
            "requested": {
                r: int(snapshot.requested[k, i])
                for k, r in enumerate(resources)
                if snapshot.requested[k, i]
            },
            "non_zero": tuple(int(v) for v in snapshot.non_zero_requested[:, i]),
            "pods": int(snapshot.pod_counts[i]),
            "allowed": int(snapshot.allowed_pods[i]),
            "unschedulable": bool(snapshot.unschedulable[i]),
            "labels": labels,
            "taints": taints,
            "hard": int(snapshot.hard_taint_counts[i]),
            "soft": int(snapshot.soft_taint_counts[i]),
            "pod_keys": {p.key for p in snapshot.pods_on(i)},
            "ports": dict(snapshot.used_ports(i)),
            "node": snapshot.node(i),
        }
    return out


def node_variant(name: str, variant: int) -> Node:
    builder = make_node(name, cpu=f"{1 + variant}", memory=f"{variant + 1}Gi", pods=3 + variant)
    if variant % 2:
        builder.label("zone", f"z{variant % 3}").taint("k", str(variant), "NoSchedule")
    if variant % 3 == 0:
        builder.taint("soft", effect="PreferNoSchedule").resource("example.com/dev", str(variant))
    if variant == 4:
        builder.unschedulable()
    return builder.build()


def pod_variant(index: int, variant: int) -> Pod:
    builder = make_pod(f"p{index}", cpu=f"{100 * (variant + 1)}m").uid(f"pod-{index}")
    if variant % 2:
        builder.host_port(8000 + variant)
    if variant % 3 == 0:
        builder.container(resources={"example.com/dev": "1"})
    if variant == 2:
        builder.pod_anti_affinity("zone", {"app": "x"})
    return builder.build()


operation = st.one_of(
    st.tuples(st.just("node"), st.sampled_from(NODE_NAMES), st.integers(0, 5)),
    st.tuples(st.just("drop-node"), st.sampled_from(NODE_NAMES), st.just(0)),
    st.tuples(
        st.just("pod"), st.integers(0, 7), st.tuples(st.sampled_from(NODE_NAMES), st.integers(0, 5))
    ),
    st.tuples(st.just("drop-pod"), st.integers(0, 7), st.just(0)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(operation, max_size=30))
def test_incremental_updates_equal_rebuild(ops: list[tuple[Any, Any, Any]]) -> None:
    snapshot = Snapshot()
    nodes: dict[str, Node] = {}
    pods: dict[int, tuple[Pod, str]] = {}
    for kind, a, b in ops:
        if kind == "node":
            node = node_variant(a, b)
            nodes[a] = node
            snapshot.add_node(node)
        elif kind == "drop-node":
            nodes.pop(a, None)
            snapshot.remove_node(a)
        elif kind == "pod":
            node_name, variant = b
            pod = pod_variant(a, variant)
            pods[a] = (pod, node_name)
            snapshot.add_pod(pod, node_name)
        else:
            if a in pods:
                snapshot.remove_pod(pods.pop(a)[0])
    rebuilt = Snapshot(nodes.values(), pods.values())
    assert view(snapshot) == view(rebuilt)
    assert snapshot.num_nodes == len(nodes)
    assert {p.key for p, _ in snapshot.pods_with_required_anti_affinity()} == {
        p.key for p, node in pods.values() if node in nodes and p.has_required_anti_affinity
    }
    for pod, node_name in pods.values():
        assert snapshot.node_of_pod(pod.key) == node_name


def test_pods_on_missing_nodes_wait_for_the_node() -> None:
    snapshot = Snapshot()
    pod = make_pod("p", cpu="1").build()
    snapshot.add_pod(pod, "later")
    assert snapshot.node_of_pod(pod.key) == "later"
    snapshot.add_node(make_node("later").build())
    i = snapshot.index_of("later")
    assert i is not None
    assert int(snapshot.pod_counts[i]) == 1
    snapshot.remove_node("later")
    assert snapshot.num_nodes == 0
    snapshot.add_node(make_node("later").build())
    i = snapshot.index_of("later")
    assert i is not None
    assert int(snapshot.requested[0, i]) == 1000
    snapshot.remove_pod(pod.key)
    assert int(snapshot.pod_counts[i]) == 0


def test_update_node_keeps_pods_and_replaces_labels() -> None:
    snapshot = Snapshot([make_node("n", zone="a").build()], [(make_pod("p", cpu="1").build(), "n")])
    snapshot.update_node(make_node("n", cpu="8", rack="r1").build())
    (row,) = view(snapshot).values()
    assert row["labels"] == {"kubernetes.io/hostname": "n", "rack": "r1"}
    assert row["requested"] == {"cpu": 1000}
    assert row["alloc"]["cpu"] == 8000


def test_add_pod_twice_moves_it() -> None:
    snapshot = Snapshot([make_node("a").build(), make_node("b").build()])
    pod = make_pod("p", cpu="1").build()
    snapshot.add_pod(pod, "a")
    snapshot.add_pod(pod, "b")
    rows = view(snapshot)
    assert rows["a"]["pods"] == 0
    assert rows["b"]["pods"] == 1


def test_growth_beyond_initial_capacity() -> None:
    snapshot = Snapshot(make_node(f"n{i}", zone=str(i % 3)).build() for i in range(100))
    assert snapshot.num_nodes == 100
    assert len(snapshot.node_names) == 100
    assert snapshot.has_label_mask("zone").all()


def test_namespaces() -> None:
    snapshot = Snapshot(namespaces=[make_namespace("team", env="prod")])
    assert snapshot.namespace_labels("team") == {"env": "prod"}
    assert snapshot.namespace_labels("other") is None
    snapshot.remove_namespace("team")
    assert snapshot.namespace_labels("team") is None


def test_priorities_below_follow_every_pod_placed_parked_and_removed() -> None:
    snap = Snapshot()
    snap.add_node(make_node("a").build())
    low = make_pod("low").priority(5).build()
    high = make_pod("high").priority(50).build()
    assert not snap.has_priority_below(100)
    snap.add_pod(low, "a")
    snap.add_pod(high, "a")
    assert snap.has_priority_below(6)
    assert not snap.has_priority_below(5)
    snap.add_pod(low, "a")  # moved onto the same node: still one pod
    snap.remove_pod(low)
    assert not snap.has_priority_below(50)
    snap.remove_node("a")  # parked with its node gone: still known
    assert snap.has_priority_below(51)
    snap.remove_pod(high)
    assert not snap.has_priority_below(1000)


@settings(max_examples=200, deadline=None)
@given(
    labels=st.lists(st.sampled_from(("a", "b", "c", None)), min_size=0, max_size=6),
    values=st.dictionaries(st.sampled_from(("a", "b", "c", "x", "y")), st.integers(-5, 5)),
)
def test_per_label_value_and_per_node_name_equal_a_loop(
    labels: list[str | None], values: dict[str, int]
) -> None:
    """Rows without the label and values no node carries read 0, whatever the mix."""
    snapshot = Snapshot()
    for i, value in enumerate(labels):
        node = make_node(f"n{i}")
        snapshot.add_node((node if value is None else node.label("k", value)).build())
    per_row = snapshot.per_label_value("k", values)
    for i, value in enumerate(labels):
        row = snapshot.index_of(f"n{i}")
        assert per_row[row] == (0 if value is None else values.get(value, 0))
    assert snapshot.per_label_value("missing", values).tolist() == [0] * len(labels)
    names = {f"n{i}" if k in "abc" else k: v for i, (k, v) in enumerate(values.items())}
    by_name = snapshot.per_node_name(names)
    for i in range(len(labels)):
        row = snapshot.index_of(f"n{i}")
        assert by_name[row] == names.get(f"n{i}", 0)

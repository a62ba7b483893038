"""Opportunistic batching: a run of identical pods decided from the last cycle's memo gets
exactly what full cycles give (node, totals, feasible rows), and batches only where safe."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.batch import Batch, signature
from scheduler.core.profile import DEFAULT_PROFILE
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.model.pod import Pod
from tests.builders import NodeBuilder, PodBuilder, PodLike, cluster, expr, make_node, make_pod

FRAMEWORK = Framework(DEFAULT_PROFILE)


def _pods(template: PodBuilder, count: int) -> list[Pod]:
    out = []
    for i in range(count):
        body = template.obj()
        body["metadata"]["name"] = f"p{i}"
        body["metadata"]["uid"] = f"uid-{i}"
        out.append(Pod.from_api(body))
    return out


def _run(
    snapshot: Snapshot,
    pods: list[Pod],
    batch: Batch | None,
    foreign_at: frozenset[int] = frozenset(),
    seed: int = 0,
) -> list[tuple[str | None, list[int], list[int]]]:
    """Place ``pods`` one after another as the controller does; at the indices in
    ``foreign_at`` a pod of another shape lands on the first node first."""
    out: list[tuple[str | None, list[int], list[int]]] = []
    for i, pod in enumerate(pods):
        if i in foreign_at:
            other = make_pod(f"foreign-{i}", cpu="100m").uid(f"f-{i}").build()
            snapshot.add_pod(other, snapshot.node_names[0])
        decision = FRAMEWORK.schedule(snapshot, pod, seed=seed, batch=batch)
        explanation = decision.explanation
        feasible = explanation.feasible_rows.tolist()
        out.append((decision.selected, feasible, [int(explanation.totals[r]) for r in feasible]))
        if decision.selected is not None:
            snapshot.add_pod(pod, decision.selected)
            if batch is not None:
                batch.assumed(snapshot, decision.selected)
    return out


def _nodes(sizes: list[tuple[int, int, str]]) -> list[NodeBuilder]:
    nodes: list[NodeBuilder] = []
    for i, (cpu, memory_gi, kind) in enumerate(sizes):
        node = make_node(f"n{i}", cpu=str(cpu), memory=f"{memory_gi}Gi", pods=20, zone=f"z{i % 2}")
        if kind == "soft-taint":
            node.taint("spot", "true", "PreferNoSchedule")
        elif kind == "hard-taint":
            node.taint("dedicated", "x", "NoSchedule")
        elif kind == "cordoned":
            node.unschedulable()
        nodes.append(node)
    return nodes


_SIZES = st.lists(
    st.tuples(
        st.integers(1, 16),
        st.integers(1, 64),
        st.sampled_from(["plain", "plain", "soft-taint", "hard-taint", "cordoned"]),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(
    sizes=_SIZES,
    cpu=st.sampled_from(["100m", "250m", "1", "3"]),
    memory=st.sampled_from(["128Mi", "1Gi", "6Gi"]),
    shape=st.sampled_from(["plain", "tolerates", "selector", "preferred", "best-effort"]),
    count=st.integers(1, 40),
    foreign=st.frozensets(st.integers(0, 39), max_size=4),
    seed=st.integers(0, 3),
    neighbours=st.booleans(),
)
def test_batched_decisions_equal_full_cycles(
    sizes: list[tuple[int, int, str]],
    cpu: str,
    memory: str,
    shape: str,
    count: int,
    foreign: frozenset[int],
    seed: int,
    neighbours: bool,
) -> None:
    """``neighbours``: placed pods whose required anti-affinity and preferred affinity
    match the template's label (InterPodAffinity's filter and score take part)."""
    template = make_pod("t") if shape == "best-effort" else make_pod("t", cpu=cpu, memory=memory)
    if shape == "tolerates":
        template.toleration("spot", "true", "PreferNoSchedule")
    elif shape == "selector":
        template.node_selector({"zone": "z0"})
    elif shape == "preferred":
        template.preferred_node_affinity(10, expr("zone", "In", "z1"))
    template.label("app", "t")
    pods = _pods(template, count)
    nodes = _nodes(sizes)
    placed: list[tuple[PodLike, str]] = []
    if neighbours:
        placed.append((make_pod("anti").uid("anti").pod_anti_affinity("zone", {"app": "t"}), "n0"))
        placed.append(
            (
                make_pod("pref")
                .uid("pref")
                .pod_affinity("kubernetes.io/hostname", {"app": "t"}, weight=5),
                f"n{len(nodes) - 1}",
            )
        )
    batch = Batch()
    batched = _run(cluster(nodes, placed), pods, batch, foreign, seed)
    full = _run(cluster(nodes, placed), pods, None, foreign, seed)
    assert batched == full


def test_a_run_of_identical_pods_is_batched_and_stops_at_a_change() -> None:
    nodes = [make_node(f"n{i}", cpu="8", memory="32Gi") for i in range(6)]
    pods = _pods(make_pod("t", cpu="500m", memory="1Gi"), 20)
    batch = Batch()
    _run(cluster(nodes), pods, batch)
    assert batch.hits == 19  # every pod after the first
    batch = Batch()
    _run(cluster(nodes), pods, batch, foreign_at=frozenset({5, 10}))
    assert batch.hits == 17  # the pods right after a foreign pod ran the full cycle
    assert batch.misses == 3  # the first pod and the two after a foreign one


def test_unrelated_pods_in_between_and_no_assume_break_the_batch() -> None:
    snapshot = cluster([make_node(f"n{i}", cpu="8", memory="32Gi") for i in range(4)])
    a, b = _pods(make_pod("t", cpu="1", memory="1Gi"), 2)
    batch = Batch()
    first = FRAMEWORK.schedule(snapshot, a, batch=batch)
    assert first.selected is not None
    # Not assumed (the binding cycle was not started): the memo must not serve.
    FRAMEWORK.schedule(snapshot, b, batch=batch)
    assert batch.hits == 0
    # A pod of another shape in between ends the batch too.
    other = make_pod("o", cpu="2", memory="1Gi").uid("o").build()
    decision = FRAMEWORK.schedule(snapshot, other, batch=batch)
    assert decision.selected is not None
    snapshot.add_pod(other, decision.selected)
    batch.assumed(snapshot, decision.selected)
    FRAMEWORK.schedule(snapshot, a, batch=batch)
    assert batch.hits == 0


def test_pods_whose_cycle_depends_on_other_nodes_are_not_batched() -> None:
    spread = make_pod("s", cpu="1").spread(1, "zone", {"app": "x"}).label("app", "x").build()
    anti = make_pod("a", cpu="1").pod_anti_affinity("kubernetes.io/hostname", {"app": "x"}).build()
    ports = make_pod("h", cpu="1").host_port(8080).build()
    assert signature(spread) is None
    assert signature(anti) is None
    assert signature(ports) is None
    plain = make_pod("p", cpu="1").build()
    other = make_pod("q", cpu="1").uid("other").build()
    assert signature(plain) == signature(other)
    assert signature(plain) != signature(make_pod("p", cpu="2").build())


def test_a_node_that_fills_up_falls_back_to_the_full_cycle() -> None:
    nodes = [make_node("small", cpu="2", memory="8Gi"), make_node("big", cpu="64", memory="8Gi")]
    pods = _pods(make_pod("t", cpu="1", memory="1Gi"), 6)
    batched = _run(cluster(nodes), pods, Batch())
    assert batched == _run(cluster(nodes), pods, None)

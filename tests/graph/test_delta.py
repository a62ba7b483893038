"""DeltaGraph patches: diff, apply, invert and replay on arbitrary small graphs."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.graph.delta import (
    AddEdge,
    AddVertex,
    DeltaGraph,
    Op,
    Patch,
    PatchError,
    RemoveEdge,
    RemoveVertex,
    SetAttrs,
    apply,
    diff,
    invert,
)

VERTICES = tuple(f"v{i}" for i in range(6))
attrs = st.fixed_dictionaries({}, optional={"a": st.integers(0, 2), "b": st.sampled_from("xy")})


@st.composite
def graphs(draw: st.DrawFn) -> DeltaGraph:
    vertices = draw(st.lists(st.sampled_from(VERTICES), unique=True, max_size=len(VERTICES)))
    ops: list[Op] = [AddVertex(v, draw(attrs)) for v in vertices]
    if vertices:
        edges = draw(
            st.lists(
                st.tuples(
                    st.sampled_from(vertices), st.sampled_from(vertices), st.sampled_from("kl")
                ),
                unique=True,
                max_size=10,
            )
        )
        ops += [AddEdge(u, v, k, draw(attrs)) for u, v, k in edges]
    graph = DeltaGraph()
    graph.apply(Patch(draw(st.integers(1, 5)), tuple(ops)))
    return graph


@settings(max_examples=100, deadline=None)
@given(graphs(), graphs())
def test_diff_then_apply_reaches_the_target(g1: DeltaGraph, g2: DeltaGraph) -> None:
    assert apply(g1.copy(), diff(g1, g2)) == g2


@settings(max_examples=100, deadline=None)
@given(graphs(), graphs())
def test_invert_undoes(g: DeltaGraph, target: DeltaGraph) -> None:
    p = diff(g, target)
    assert apply(apply(g.copy(), p), invert(p)) == g
    assert invert(invert(p)).ops == p.ops


@settings(max_examples=100, deadline=None)
@given(graphs(), graphs())
def test_replaying_a_patch_is_a_no_op(g: DeltaGraph, target: DeltaGraph) -> None:
    p = diff(g, target)
    patched = apply(g.copy(), p)
    assert patched.seq == p.seq
    assert not patched.apply(p)
    assert patched == target
    older = Patch(p.seq - 1, p.ops)
    assert not patched.apply(older)  # anything at or below the last sequence number


@settings(max_examples=60, deadline=None)
@given(graphs(), graphs())
def test_a_failing_patch_changes_nothing(g: DeltaGraph, target: DeltaGraph) -> None:
    p = diff(g, target)
    bad = Patch(p.seq, (*p.ops, AddVertex("ghost", {}), AddVertex("ghost", {})))
    copy = g.copy()
    with pytest.raises(PatchError):
        copy.apply(bad)
    assert copy == g
    assert copy.seq == g.seq
    assert copy.number_of_edges() == g.raw.number_of_edges()  # the count rolled back too


@settings(max_examples=100, deadline=None)
@given(graphs(), graphs())
def test_the_edge_count_is_networkx_own(g: DeltaGraph, target: DeltaGraph) -> None:
    p = diff(g, target)
    patched = apply(g.copy(), p)
    assert patched.number_of_edges() == patched.raw.number_of_edges()
    undone = apply(patched, invert(p))
    assert undone.number_of_edges() == undone.raw.number_of_edges() == g.number_of_edges()


def _single(op: Op, base: list[Op] | None = None) -> Any:
    graph = DeltaGraph()
    graph.apply(Patch(1, tuple(base or [AddVertex("a", {}), AddVertex("b", {})])))
    return lambda: graph.apply(Patch(2, (op,)))


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(AddVertex("a", {}), id="add-present-vertex"),
        pytest.param(RemoveVertex("zz", {}), id="remove-absent-vertex"),
        pytest.param(RemoveVertex("a", {"x": 1}), id="remove-vertex-with-other-attrs"),
        pytest.param(SetAttrs("a", {"x": 1}, {}), id="set-attrs-from-stale-state"),
        pytest.param(AddEdge("a", "zz", "k", {}), id="edge-to-missing-vertex"),
        pytest.param(RemoveEdge("a", "b", "k", {}), id="remove-absent-edge"),
    ],
)
def test_operations_are_checked(op: Op) -> None:
    with pytest.raises(PatchError):
        _single(op)()


def test_vertices_leave_only_once_isolated() -> None:
    base: list[Op] = [AddVertex("a", {}), AddVertex("b", {}), AddEdge("a", "b", "k", {"w": 1})]
    with pytest.raises(PatchError, match="still has edges"):
        _single(RemoveVertex("b", {}), base)()
    with pytest.raises(PatchError, match="absent or different"):
        _single(RemoveEdge("a", "b", "k", {"w": 2}), base)()


def test_parallel_edges_are_told_apart_by_key() -> None:
    graph = DeltaGraph()
    graph.apply(
        Patch(
            1,
            (
                AddVertex("p", {}),
                AddVertex("t", {}),
                AddEdge("p", "t", "declares", {}),
                AddEdge("p", "t", "matches", {}),
            ),
        )
    )
    assert set(graph.edges()) == {("p", "t", "declares"), ("p", "t", "matches")}
    assert graph.number_of_edges() == 2

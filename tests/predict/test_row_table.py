"""The row table's memoised gather stays exact when nodes get rows in place (the patch
that spares a rebuild over every node per cycle) and when rows are dropped or reused."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.predict.predictor import _RowTable

NODES = tuple(f"n{i}" for i in range(8))

op = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(NODES), st.floats(0, 100)),
    st.tuples(st.just("drop"), st.sampled_from(NODES), st.just(0.0)),
    st.tuples(st.just("gather"), st.just(""), st.just(0.0)),
    st.tuples(st.just("relist"), st.just(""), st.just(0.0)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=60))
def test_gather_matches_the_rows_as_set(ops: list[tuple[str, str, float]]) -> None:
    table = _RowTable()
    nodes = NODES
    inflight: dict[str, float] = {}
    for kind, node, value in ops:
        if kind == "set":
            table.set(node, None, value, 0.0)
            inflight[node] = value
        elif kind == "drop":
            table.drop(node)
            inflight.pop(node, None)
        elif kind == "relist":
            nodes = tuple(reversed(nodes))  # a new tuple: the memo must not be reused
        got = table.gather(nodes)
        want = np.array([inflight.get(n, 0.0) for n in nodes])
        np.testing.assert_array_equal(got.inflight_cpu, want)

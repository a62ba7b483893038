"""The vectorised batch agrees with the per-node breakdown after any sequence of changes.

`predict` reads a column table kept up to date node by node; `explain` recomputes one node
from its state. Random operation sequences (reports, placements, forgets, node removals,
config swaps) must leave the two in agreement for every node, including nodes never seen.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.predict import CpuMem, LoadPredictor, LoadStatus, PredictConfig

NODES = ("a", "b", "c", "d")
CAP_CPU, CAP_MEM = 4000, 16 * 1024**3

op = st.one_of(
    st.tuples(
        st.just("report"),
        st.sampled_from(NODES),
        st.floats(0, 5000),
        st.floats(0, 2e10),
    ),
    st.tuples(st.just("place"), st.sampled_from(NODES), st.integers(0, 9), st.integers(0, 2000)),
    st.tuples(st.just("forget"), st.integers(0, 9)),
    st.tuples(st.just("drop"), st.sampled_from(NODES)),
    st.tuples(st.just("config"), st.floats(0.05, 1.0), st.floats(0.5, 2.0), st.floats(0.0, 0.5)),
    st.tuples(st.just("tick"), st.floats(0.5, 40.0)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=40))
def test_batch_matches_breakdown(ops: list[tuple[object, ...]]) -> None:
    p = LoadPredictor(PredictConfig(report_interval_s=10.0, stale_after_s=30.0))
    now = 100.0
    for o in ops:
        kind = o[0]
        if kind == "report":
            _, node, cpu, mem = o
            p.observe(str(node), now, float(str(cpu)), float(str(mem)), CAP_CPU, CAP_MEM)
        elif kind == "place":
            _, node, pod, cpu = o
            p.note_placement(str(node), f"pod-{pod}", int(str(cpu)), 0, now)
        elif kind == "forget":
            p.forget_pod(f"pod-{o[1]}")
        elif kind == "drop":
            p.forget_node(str(o[1]))
        elif kind == "config":
            _, alpha, scale, beta = o
            p.replace_config(
                PredictConfig(
                    report_interval_s=10.0,
                    stale_after_s=30.0,
                    cpu_alpha=float(str(alpha)),
                    cpu_request_scale=float(str(scale)),
                    trend_beta=float(str(beta)),
                    horizon_s=5.0,
                )
            )
        else:
            now += float(str(o[1]))
    names = (*NODES, "never")
    req = np.array([100, 200, 300, 400, 500], dtype=np.int64)
    alloc = np.full(5, 3000, dtype=np.int64)
    batch = p.predict(names, req, req * 1000, alloc, alloc * 1000, now=now)
    for i, name in enumerate(names):
        b = p.explain(
            name,
            requested=CpuMem(float(req[i]), float(req[i] * 1000)),
            allocatable=CpuMem(float(alloc[i]), float(alloc[i] * 1000)),
            now=now,
        )
        assert LoadStatus(int(batch.status[i])) is b.status
        assert math.isclose(batch.cpu_used_milli[i], b.total.cpu, rel_tol=1e-9, abs_tol=1e-6)
        assert math.isclose(batch.mem_used_bytes[i], b.total.memory, rel_tol=1e-9, abs_tol=1e-3)
        assert batch.cpu_capacity_milli[i] == b.capacity.cpu
        assert batch.mem_capacity_bytes[i] == b.capacity.memory
        if b.status is LoadStatus.FRESH:
            assert b.psi is not None
            assert batch.cpu_pressure[i] == b.psi.cpu_some
        else:
            assert math.isnan(batch.cpu_pressure[i])

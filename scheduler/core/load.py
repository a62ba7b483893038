"""The load the LoadAware plugin sees in one cycle: the predictor, the clock, the snapshot.

The predictor (:class:`~scheduler.predict.LoadPredictor`) lives with the controller, next to
the snapshot, and is fed by agents' reports and by the controller's own placements. A cycle
gets a :class:`LoadView` - the predictor plus the cycle's ``now`` - and asks it once for a
:class:`~scheduler.predict.PredictionBatch` aligned with the snapshot's node rows, whose
requested totals and allocatable are the fallback for nodes without a fresh report. Pure:
``now`` is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler.core.snapshot import IntArray, Snapshot
from scheduler.model.names import CPU, MEMORY
from scheduler.model.topology import NodeLoad, PressureReadings
from scheduler.predict import LoadPredictor, LoadReport, PredictionBatch, PsiSample


@dataclass(frozen=True, slots=True)
class LoadView:
    predictor: LoadPredictor
    now: float
    """Seconds on the agents' clock (Unix time): report ages are measured against it."""

    def may_have_fresh(self) -> bool:
        """See :meth:`~scheduler.predict.LoadPredictor.may_have_fresh`."""
        return self.predictor.may_have_fresh(self.now)

    def batch(self, snapshot: Snapshot) -> PredictionBatch:
        req_cpu, alloc_cpu = _column(snapshot, CPU)
        req_mem, alloc_mem = _column(snapshot, MEMORY)
        return self.predictor.predict(
            snapshot.node_names, req_cpu, req_mem, alloc_cpu, alloc_mem, now=self.now
        )


def _column(snapshot: Snapshot, resource: str) -> tuple[IntArray, IntArray]:
    col = snapshot.resource_column(resource)
    if col is None:
        zeros = np.zeros(snapshot.num_nodes, dtype=np.int64)
        return zeros, zeros
    return snapshot.requested[col], snapshot.allocatable[col]


def psi_sample(pressure: PressureReadings | None) -> PsiSample:
    """The PSI figures the predictor uses: cpu some, memory some and full, avg10."""
    if pressure is None:
        return PsiSample()
    memory = pressure.memory
    return PsiSample(
        cpu_some=pressure.cpu.some.avg10 if pressure.cpu is not None else 0.0,
        memory_some=memory.some.avg10 if memory is not None else 0.0,
        memory_full=memory.full.avg10 if memory is not None and memory.full is not None else 0.0,
    )


def load_report(node: str, load: NodeLoad, pressure: PressureReadings | None) -> LoadReport:
    """A NodeTopology status's load (and PSI) in the predictor's shape."""
    return LoadReport(
        node=node,
        sample_time=load.sample_time.timestamp(),
        cpu_used_milli=float(load.cpu_used_milli),
        mem_used_bytes=float(load.mem_used_bytes),
        cpu_capacity_milli=load.cpu_capacity_milli,
        mem_capacity_bytes=load.mem_capacity_bytes,
        psi=psi_sample(pressure),
    )

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
from scheduler.predict import LoadPredictor, PredictionBatch


@dataclass(frozen=True, slots=True)
class LoadView:
    predictor: LoadPredictor
    now: float
    """Seconds on the agents' clock (Unix time): report ages are measured against it."""

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

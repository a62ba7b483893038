"""Plain values exchanged with the predictor: reports in, estimates and predictions out.

A `LoadReport` is what a node agent (real or synthetic) publishes: absolute
used CPU (millicores) and memory (bytes) with the capacities they are measured
against, so the estimate of a pod (its requests, in the same units) can simply
be added. PSI comes as the kernel's avg10 percentages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np
from numpy.typing import NDArray


class LoadStatus(IntEnum):
    """How far a node's prediction can be trusted; the int value is used in arrays."""

    FRESH = 0
    """A recent report exists: prediction = EWMA of measured use + in-flight estimates."""
    STALE = 1
    """Reports stopped: utilisation falls back to requests (never read as idle)."""
    UNKNOWN = 2
    """No report ever: utilisation is taken from requests."""


class ObserveOutcome(IntEnum):
    """What became of one report; a counter per outcome makes agent trouble visible."""

    ACCEPTED = 0
    DUPLICATE = 1
    """Same sample time as the newest accepted report (a re-delivery)."""
    OUT_OF_ORDER = 2
    """Older than the newest accepted report."""
    FROM_FUTURE = 3
    """Dated beyond the caller's clock plus the allowed skew."""
    INVALID = 4
    """Negative, non-finite or zero-capacity numbers."""


@dataclass(frozen=True, slots=True)
class PsiSample:
    """The PSI avg10 percentages (0..100) the predictor uses, flattened from /proc/pressure.

    avg10 already smooths over 10 s, so it is used as reported (not EWMA'd).
    `scheduler.model.topology.PressureReadings` maps onto it as cpu.some.avg10,
    memory.some.avg10 and memory.full.avg10.
    """

    cpu_some: float = 0.0
    memory_some: float = 0.0
    memory_full: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadReport:
    """One agent sample; the shape `LoadPredictor.observe_report` accepts."""

    node: str
    sample_time: float
    cpu_used_milli: float
    mem_used_bytes: float
    cpu_capacity_milli: int
    mem_capacity_bytes: int
    psi: PsiSample = field(default_factory=PsiSample)


@dataclass(frozen=True, slots=True)
class CpuMem:
    """A (cpu millicores, memory bytes) pair, or a pair of fractions where documented."""

    cpu: float
    memory: float


@dataclass(frozen=True, slots=True)
class PodEstimate:
    """Predicted use of one pod, in millicores and bytes, from its requests."""

    cpu_milli: float
    memory_bytes: float


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeLoadBreakdown:
    """Everything behind one node's prediction, for `lattice explain` and events."""

    node: str
    status: LoadStatus
    age_s: float | None
    """Seconds since the newest sample; None when the node never reported."""
    measured: CpuMem | None
    """The newest sample as reported."""
    predicted: CpuMem | None
    """EWMA (plus trend) of the samples, before in-flight estimates."""
    inflight: CpuMem
    """Sum of the (fading) estimates of pods placed and not yet covered by a report."""
    inflight_pods: tuple[str, ...]
    requested: CpuMem
    """The caller's requested totals (used instead of measurements when not fresh)."""
    total: CpuMem
    """What the scores use: predicted + inflight when fresh, requested otherwise."""
    capacity: CpuMem
    """Denominator of `utilisation`: reported capacity when fresh, allocatable otherwise."""
    utilisation: CpuMem
    """total / capacity, as fractions."""
    psi: PsiSample | None
    """The newest sample's pressure, only when fresh."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PredictionBatch:
    """Predictions for an ordered list of nodes, as parallel numpy arrays.

    The arrays are copies: a batch is a consistent snapshot for one scheduling
    cycle, unaffected by reports that arrive while the cycle runs.
    """

    nodes: tuple[str, ...]
    cpu_used_milli: NDArray[np.float64]
    """Predicted CPU in use (fresh) or requested (stale/unknown)."""
    mem_used_bytes: NDArray[np.float64]
    cpu_capacity_milli: NDArray[np.float64]
    """Denominator for CPU: reported capacity when fresh, allocatable otherwise."""
    mem_capacity_bytes: NDArray[np.float64]
    status: NDArray[np.int8]
    """`LoadStatus` values."""
    age_s: NDArray[np.float64]
    """Seconds since the newest sample; NaN for unknown nodes."""
    cpu_pressure: NDArray[np.float64]
    """PSI cpu some avg10 of fresh nodes; NaN when stale or unknown."""
    memory_pressure: NDArray[np.float64]
    """PSI memory some avg10 of fresh nodes; NaN when stale or unknown."""

    @property
    def cpu_utilisation(self) -> NDArray[np.float64]:
        """Predicted CPU as a fraction of capacity (inf where capacity is 0)."""
        return utilisation(self.cpu_used_milli, self.cpu_capacity_milli)

    @property
    def memory_utilisation(self) -> NDArray[np.float64]:
        """Predicted memory as a fraction of capacity (inf where capacity is 0)."""
        return utilisation(self.mem_used_bytes, self.mem_capacity_bytes)

    def __len__(self) -> int:
        return len(self.nodes)


def utilisation(used: NDArray[np.float64], capacity: NDArray[np.float64]) -> NDArray[np.float64]:
    """used / capacity; a node without capacity counts as infinitely loaded, never as idle."""
    out = np.full(used.shape, np.inf, dtype=np.float64)
    np.divide(used, capacity, out=out, where=capacity > 0)
    return out

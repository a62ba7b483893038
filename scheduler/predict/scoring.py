"""Load-aware scores and the threshold filter, as pure numpy functions over a batch.

Every function judges a node by its utilisation *after* the incoming pod's
estimate is added (`utilisation_after`): scoring the node as it is now is how
hot nodes keep winning while the pods just sent there are still starting.
The batch already holds the right base for each node - the smoothed
measurement plus in-flight estimates when fresh, requested totals over
allocatable when stale or unknown - so these functions treat all nodes alike;
the batch's `status` is there for a plugin that wants to penalise stale nodes.

Scores are int64 in 0..100, rounded once at the end, and combine CPU and
memory with integer weights. Utilisation above 1 (overcommit, or a node with
no capacity) is clipped to 1, so such a node scores as full, never as idle.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from scheduler.predict.types import PodEstimate, PredictionBatch, utilisation

MAX_SCORE = 100


def utilisation_after(
    batch: PredictionBatch, pod: PodEstimate
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(cpu, memory) utilisation of every node if the pod were placed there."""
    cpu = utilisation(batch.cpu_used_milli + pod.cpu_milli, batch.cpu_capacity_milli)
    mem = utilisation(batch.mem_used_bytes + pod.memory_bytes, batch.mem_capacity_bytes)
    return cpu, mem


def _combine(
    cpu: NDArray[np.float64], mem: NDArray[np.float64], cpu_weight: int, memory_weight: int
) -> NDArray[np.int64]:
    if cpu_weight < 0 or memory_weight < 0 or cpu_weight + memory_weight == 0:
        raise ValueError(f"bad weights cpu={cpu_weight} memory={memory_weight}")
    fraction = (cpu_weight * cpu + memory_weight * mem) / (cpu_weight + memory_weight)
    scores = np.rint(np.clip(fraction, 0.0, 1.0) * MAX_SCORE)
    return scores.astype(np.int64)


def least_loaded_scores(
    batch: PredictionBatch,
    pod: PodEstimate,
    *,
    cpu_weight: int = 1,
    memory_weight: int = 1,
) -> NDArray[np.int64]:
    """Spread: 100 for an idle node, 0 for a full one, linear in free fraction.

    Non-increasing in each resource's load, so a hotter node never outscores
    a cooler one with the same weights.
    """
    cpu, mem = utilisation_after(batch, pod)
    free_cpu = 1.0 - np.clip(cpu, 0.0, 1.0)
    free_mem = 1.0 - np.clip(mem, 0.0, 1.0)
    return _combine(free_cpu, free_mem, cpu_weight, memory_weight)


def target_packing(utilisation: NDArray[np.float64], target: float) -> NDArray[np.float64]:
    """Trimaran's TargetLoadPacking curve, as a fraction of the top score.

    Rises linearly from `target` at an idle node to 1 at the target, so nodes
    fill up towards it (bin packing, leaving headroom for spikes); past the
    target it drops at once to `target` and falls linearly to 0 at full, so a
    node pushed over its target loses to every node still under it.
    """
    if not 0.0 < target < 1.0:
        raise ValueError(f"target must be in (0, 1), got {target}")
    u = np.clip(utilisation, 0.0, 1.0)
    rising = target + (1.0 - target) * u / target
    falling = target * (1.0 - u) / (1.0 - target)
    return np.where(u <= target, rising, falling)


def target_packing_scores(
    batch: PredictionBatch,
    pod: PodEstimate,
    *,
    cpu_target: float = 0.4,
    memory_target: float = 0.6,
    cpu_weight: int = 1,
    memory_weight: int = 0,
) -> NDArray[np.int64]:
    """Pack towards target utilisations; CPU only by default, as in Trimaran."""
    cpu, mem = utilisation_after(batch, pod)
    return _combine(
        target_packing(cpu, cpu_target),
        target_packing(mem, memory_target),
        cpu_weight,
        memory_weight,
    )


@dataclass(frozen=True, slots=True)
class ThresholdVerdict:
    """Per-node reasons to filter a node out; True means *reject* for that reason."""

    cpu: NDArray[np.bool_]
    memory: NDArray[np.bool_]
    cpu_pressure: NDArray[np.bool_]
    memory_pressure: NDArray[np.bool_]

    @property
    def rejected(self) -> NDArray[np.bool_]:
        """Nodes rejected for any reason."""
        return self.cpu | self.memory | self.cpu_pressure | self.memory_pressure


def threshold_verdict(
    batch: PredictionBatch,
    pod: PodEstimate,
    *,
    cpu_threshold: float | None = None,
    memory_threshold: float | None = None,
    cpu_pressure_threshold: float | None = None,
    memory_pressure_threshold: float | None = None,
) -> ThresholdVerdict:
    """Which nodes would run too hot with the pod; every check is off when its threshold is None.

    Utilisation checks apply to every node (stale and unknown ones by
    requests). Pressure is only known for fresh nodes: NaN never rejects, so
    a silent agent cannot empty the cluster.
    """
    n = len(batch)
    off = np.zeros(n, dtype=np.bool_)
    cpu, mem = utilisation_after(batch, pod)
    return ThresholdVerdict(
        cpu=off.copy() if cpu_threshold is None else cpu > cpu_threshold,
        memory=off.copy() if memory_threshold is None else mem > memory_threshold,
        cpu_pressure=(
            off.copy()
            if cpu_pressure_threshold is None
            else np.nan_to_num(batch.cpu_pressure, nan=-1.0) > cpu_pressure_threshold
        ),
        memory_pressure=(
            off.copy()
            if memory_pressure_threshold is None
            else np.nan_to_num(batch.memory_pressure, nan=-1.0) > memory_pressure_threshold
        ),
    )

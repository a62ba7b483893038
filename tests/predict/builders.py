"""Small builders for predictor tests: a predictor with a short config, a batch from lists."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from scheduler.predict import LoadPredictor, LoadStatus, PredictConfig, PredictionBatch, PsiSample

CPU_CAP = 4000
MEM_CAP = 16 * 1024**3
INTERVAL = 15.0


def make_predictor(**overrides: Any) -> LoadPredictor:
    """A predictor whose config differs from the defaults only where a test says."""
    return LoadPredictor(PredictConfig(**overrides))


def report(
    predictor: LoadPredictor,
    node: str,
    t: float,
    cpu: float = 0.0,
    mem: float = 0.0,
    *,
    cpu_cap: int = CPU_CAP,
    mem_cap: int = MEM_CAP,
    psi: PsiSample | None = None,
) -> None:
    """Feed one report that must be accepted."""
    outcome = predictor.observe(node, t, cpu, mem, cpu_cap, mem_cap, psi=psi)
    assert outcome.name == "ACCEPTED", outcome


def predict_one(
    predictor: LoadPredictor,
    node: str,
    now: float,
    *,
    requested: tuple[int, int] = (0, 0),
    allocatable: tuple[int, int] = (CPU_CAP, MEM_CAP),
) -> PredictionBatch:
    return predictor.predict(
        [node],
        np.array([requested[0]], dtype=np.int64),
        np.array([requested[1]], dtype=np.int64),
        np.array([allocatable[0]], dtype=np.int64),
        np.array([allocatable[1]], dtype=np.int64),
        now=now,
    )


def make_batch(
    cpu_used: Sequence[float],
    mem_used: Sequence[float] | None = None,
    *,
    cpu_cap: float = 1000.0,
    mem_cap: float = 1000.0,
    status: Sequence[LoadStatus] | None = None,
    cpu_pressure: Sequence[float] | None = None,
    memory_pressure: Sequence[float] | None = None,
) -> PredictionBatch:
    """A batch straight from numbers (capacities 1000 so used reads as per-mille)."""
    n = len(cpu_used)
    mem = mem_used if mem_used is not None else [0.0] * n
    nan = [float("nan")] * n
    return PredictionBatch(
        nodes=tuple(f"n{i}" for i in range(n)),
        cpu_used_milli=np.array(cpu_used, dtype=np.float64),
        mem_used_bytes=np.array(mem, dtype=np.float64),
        cpu_capacity_milli=np.full(n, cpu_cap, dtype=np.float64),
        mem_capacity_bytes=np.full(n, mem_cap, dtype=np.float64),
        status=np.array(status if status is not None else [LoadStatus.FRESH] * n, dtype=np.int8),
        age_s=np.zeros(n, dtype=np.float64),
        cpu_pressure=np.array(cpu_pressure if cpu_pressure is not None else nan, dtype=np.float64),
        memory_pressure=np.array(
            memory_pressure if memory_pressure is not None else nan, dtype=np.float64
        ),
    )

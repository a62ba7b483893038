"""Settings of the load predictor and of the load-aware scores.

The settings arrive live from a custom resource, so they are one frozen
dataclass that validates itself on construction and reports *every* bad field
at once (an operator fixing a spec should not have to iterate). Swapping
settings never loses state: see `LoadPredictor.replace_config`.

Units: CPU in millicores, memory in bytes, times in seconds, utilisation as a
fraction of capacity (0.8 == 80 %), pressure (PSI) as the kernel's avg10
percentage (0..100).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Final

MIB: Final = 1024 * 1024


class ConfigError(ValueError):
    """Raised with every invalid field of a `PredictConfig`, one per line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid predictor config: " + "; ".join(problems))
        self.problems: tuple[str, ...] = tuple(problems)


@dataclass(frozen=True, slots=True, kw_only=True)
class PredictConfig:
    """Everything that tunes prediction, in-flight estimates and load scores."""

    # --- smoothing -------------------------------------------------------
    cpu_alpha: float = 0.4
    """EWMA weight of a new CPU sample per `report_interval_s`; CPU is noisy, so smooth more."""
    memory_alpha: float = 0.6
    """EWMA weight of a new memory sample per interval; growing memory ends in OOM: react faster."""
    report_interval_s: float = 15.0
    """Reference interval the alphas are defined for; irregular gaps rescale alpha to it."""
    trend_beta: float = 0.0
    """Holt trend weight per interval; 0 disables the trend (plain EWMA)."""
    horizon_s: float = 0.0
    """How far past now the trend is projected (only meaningful with trend_beta > 0)."""

    # --- freshness -------------------------------------------------------
    stale_after_s: float = 45.0
    """A node whose newest sample is older than this falls back to requests and is flagged stale."""
    max_future_skew_s: float = 10.0
    """Samples dated further than this past the caller's clock are rejected (clock skew guard)."""

    # --- in-flight estimates ---------------------------------------------
    settle_delay_s: float = 30.0
    """Time a new pod needs to show in usage; only samples after placement + this cover it."""
    cpu_request_scale: float = 1.0
    """Estimated CPU use of a placed pod, as a multiple of its CPU request."""
    memory_request_scale: float = 1.0
    """Estimated memory use of a placed pod, as a multiple of its memory request."""
    default_cpu_milli: int = 100
    """Estimate for a pod that requests no CPU (Trimaran uses the same default)."""
    default_memory_bytes: int = 200 * MIB
    """Estimate for a pod that requests no memory."""
    inflight_min_weight: float = 0.1
    """A covered estimate fades as the EWMA takes the pod in and is dropped below this weight.

    1.0 drops it at the first covering report.
    """

    # --- filter ----------------------------------------------------------
    cpu_threshold: float | None = None
    """Reject nodes whose predicted CPU utilisation plus the pod would exceed this; None = off."""
    memory_threshold: float | None = None
    """Same for memory; None = off."""
    cpu_pressure_threshold: float | None = None
    """Reject fresh nodes whose CPU PSI some-avg10 (percent) exceeds this; None = off."""
    memory_pressure_threshold: float | None = None
    """Reject fresh nodes whose memory PSI some-avg10 (percent) exceeds this; None = off."""

    @property
    def filters(self) -> bool:
        """Some threshold is set: only then can load reject a node (and a falling load
        make a rejected pod schedulable)."""
        return any(
            t is not None
            for t in (
                self.cpu_threshold,
                self.memory_threshold,
                self.cpu_pressure_threshold,
                self.memory_pressure_threshold,
            )
        )

    # --- preference ------------------------------------------------------
    cpu_prefer_below: float | None = 0.8
    """Rank nodes whose predicted CPU utilisation plus the pod would exceed this after every
    node that stays at or below it, whatever the other scores; None = off.

    Not a filter: when every feasible node is above, the scores alone decide. Without it
    requests-based scores (an empty node by requests scores high) can outvote the load score
    and put pods on nodes hot from load they cannot see.
    """
    memory_prefer_below: float | None = 0.9
    """Same for memory; None = off."""

    # --- scores ----------------------------------------------------------
    cpu_weight: int = 1
    """Integer weight of CPU when a score combines resources."""
    memory_weight: int = 1
    """Integer weight of memory when a score combines resources."""
    cpu_target: float = 0.4
    """Target CPU utilisation of target-load packing (Trimaran's default is 40 %)."""
    memory_target: float = 0.6
    """Target memory utilisation of target-load packing."""

    def __post_init__(self) -> None:
        problems = _validate(self)
        if problems:
            raise ConfigError(problems)


def _validate(c: PredictConfig) -> list[str]:
    problems: list[str] = []
    for f in fields(c):
        value = getattr(c, f.name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            problems.append(f"{f.name} must be a number, got {value!r}")
        elif not math.isfinite(value):
            problems.append(f"{f.name} must be finite, got {value!r}")
    if problems:
        return problems  # range checks below assume finite numbers

    def check(name: str, ok: bool, rule: str) -> None:
        if not ok:
            problems.append(f"{name} must be {rule}, got {getattr(c, name)!r}")

    for name in ("cpu_alpha", "memory_alpha"):
        check(name, 0.0 < getattr(c, name) <= 1.0, "in (0, 1]")
    check("trend_beta", 0.0 <= c.trend_beta <= 1.0, "in [0, 1]")
    check("report_interval_s", c.report_interval_s > 0.0, "> 0")
    check("horizon_s", c.horizon_s >= 0.0, ">= 0")
    check(
        "stale_after_s",
        c.stale_after_s >= c.report_interval_s,
        f">= report_interval_s ({c.report_interval_s}) or every node flaps stale",
    )
    check("max_future_skew_s", c.max_future_skew_s >= 0.0, ">= 0")
    check("settle_delay_s", c.settle_delay_s >= 0.0, ">= 0")
    for name in ("cpu_request_scale", "memory_request_scale"):
        check(name, getattr(c, name) > 0.0, "> 0")
    for name in ("default_cpu_milli", "default_memory_bytes"):
        value = getattr(c, name)
        check(name, isinstance(value, int) and value >= 0, "an integer >= 0")
    check("inflight_min_weight", 0.0 < c.inflight_min_weight <= 1.0, "in (0, 1]")
    for name in ("cpu_threshold", "memory_threshold", "cpu_prefer_below", "memory_prefer_below"):
        value = getattr(c, name)
        if value is not None:
            check(name, 0.0 < value <= 1.0, "None or in (0, 1]")
    for name in ("cpu_pressure_threshold", "memory_pressure_threshold"):
        value = getattr(c, name)
        if value is not None:
            check(name, 0.0 < value <= 100.0, "None or in (0, 100]")
    for name in ("cpu_weight", "memory_weight"):
        value = getattr(c, name)
        check(name, isinstance(value, int) and value >= 0, "an integer >= 0")
    if not problems and c.cpu_weight + c.memory_weight == 0:
        problems.append("cpu_weight and memory_weight must not both be 0")
    for name in ("cpu_target", "memory_target"):
        check(name, 0.0 < getattr(c, name) < 1.0, "in (0, 1)")
    return problems

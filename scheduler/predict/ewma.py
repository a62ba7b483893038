"""Continuous-time EWMA with an optional Holt trend, for irregularly spaced samples.

An EWMA with weight α per reference interval I is exponential decay of old
information with time constant τ = -I / ln(1-α). Writing the weight a sample
gets after a gap Δt as

    a = 1 - (1-α)^(Δt/I)

keeps τ fixed whatever the spacing: a report after a missed one (Δt = 2I)
weighs exactly as two reports of the same value would, a late report weighs
more, and after a long outage a ≈ 1 so old history is discarded by itself.
It is the exact update for a signal held constant over each gap (zero-order
hold). With α = 1 the level is the last sample.

The level is a convex combination of samples, so it always lies between the
smallest and largest sample seen; lag to reach 90 % of a step is
ceil(ln 0.1 / ln(1-α)) intervals; on a ramp of slope s it trails by
s·I·(1-α)/α.

The optional trend (Holt's linear method, β per interval rescaled the same
way) removes that ramp lag and lets the prediction be projected a horizon
ahead; it amplifies spikes, so it is off by default (β = 0 keeps trend = 0).
"""

from __future__ import annotations

from dataclasses import dataclass


def effective_weight(alpha: float, dt: float, interval: float) -> float:
    """Weight of a sample arriving `dt` seconds after the previous one (see module doc)."""
    if alpha >= 1.0:
        return 1.0
    if dt <= 0.0:
        return 0.0
    return 1.0 - float((1.0 - alpha) ** (dt / interval))


@dataclass(frozen=True, slots=True)
class Series:
    """Smoothed level and trend (units per second) of one resource of one node."""

    level: float
    trend: float = 0.0

    def forecast(self, lead_s: float) -> float:
        """Level projected `lead_s` seconds ahead along the trend."""
        return self.level + self.trend * max(lead_s, 0.0)


def update(
    series: Series, value: float, *, dt: float, alpha: float, beta: float, interval: float
) -> tuple[Series, float]:
    """Fold a sample taken `dt` (> 0) seconds after the previous one into the series.

    Returns the new series and the weight the sample got, which the caller
    uses to fade in-flight estimates at the rate the level absorbs new load.
    """
    a = effective_weight(alpha, dt, interval)
    projected = series.level + series.trend * dt
    level = a * value + (1.0 - a) * projected
    trend = series.trend
    if beta > 0.0:
        b = effective_weight(beta, dt, interval)
        trend = b * (level - series.level) / dt + (1.0 - b) * series.trend
    return Series(level=level, trend=trend), a

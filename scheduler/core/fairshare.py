"""Weighted fair share of a shared cluster between quotas: a pure computation.

Interface
---------
* :func:`parse_weight` reads the ``lattice.dev/quota-weight`` annotation (default 1): a
  positive decimal ("1", "2", "0.5"); anything else is a :class:`WeightError` naming the
  bad value, so a typo is reported instead of silently weighing 1.
* :func:`fair_shares` takes the cluster's capacity per resource (exact integers: millicores,
  bytes, devices) and, per quota, a :class:`QuotaState` (``min``, ``max``, ``used``,
  ``demand`` = used + pending requests, ``weight``), and returns a :class:`FairShare` per
  quota: the exact amounts (:class:`fractions.Fraction`) it is entitled to now.
* :func:`reclaim_order` lists the quotas above their fair share, furthest above first
  (whom reclaim takes from first); :func:`deficit` and :func:`below_fair_share` say how far
  below its share a quota is (the queue serves the tenant furthest below first).

Theory of operation
-------------------
1. **Guaranteed first.** Each quota is entitled to ``min(min, demand)`` per resource: a
   minimum nobody asks for is lent, not held. If the minimums still asked for exceed the
   capacity of a resource (an over-committed cluster, or nodes lost), that capacity is split
   in proportion to them, so the guarantee shrinks evenly instead of by name order.
2. **Leftover by weighted DRF water-filling.** What remains of each resource is divided
   between the quotas that want more (``min(demand, max) - guaranteed`` > 0 somewhere). Each
   such quota grows along its own want vector; its *dominant share* is the largest fraction of
   any resource's capacity that its extra amounts to. A common level ``s`` rises and each
   quota's dominant share of extra is ``weight * s``, until its want is met (it stops) or a
   resource it wants runs out (every quota wanting that resource stops: it cannot grow along
   its vector any more, as in Dominant Resource Fairness's progressive filling). So two teams
   borrowing idle GPUs get them in proportion to their weights, not first come, and a team
   asking for less than its proportion gets what it asks and leaves the rest to the others.
3. **Exact.** Breakpoints of the water level are solved for directly (each is a ratio of
   integers), so the shares are exact fractions: no rounding decides who is "above" a share.
   At most one quota stops per step, so a computation over ``n`` quotas takes at most ``n``
   steps of ``O(n * resources)``.

The extra share is measured on the cluster's capacity (the DRF convention, as Kueue and
KAI-Scheduler do): a quota whose only extra want is one resource that is exhausted stops,
even if other resources are idle, because it could not use them. Hierarchy
(``lattice.dev/quota-parent``) is not modelled here: all quotas are siblings.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Final

WEIGHT_ANNOTATION: Final = "lattice.dev/quota-weight"
DEFAULT_WEIGHT: Final = Fraction(1)
MAX_WEIGHT: Final = Fraction(1_000_000)
"""Weights beyond this are refused: a share a million times another's is a typo."""

_WEIGHT_RE: Final = re.compile(r"[0-9]+(?:\.[0-9]+)?|\.[0-9]+")

Amounts = Mapping[str, int]
"""Integer amounts by resource name (cpu in millicores, memory in bytes, devices in units)."""

Shares = Mapping[str, Fraction]
"""Exact, possibly fractional amounts by resource name."""


class WeightError(ValueError):
    """A ``lattice.dev/quota-weight`` annotation that is not a positive decimal."""


def parse_weight(annotations: Mapping[str, str] | None) -> Fraction:
    """The quota's weight from its annotations; 1 when absent.

    Accepted: a positive decimal with at most 6 fractional digits, up to a million. Signs,
    exponents, units and ``0`` are refused with an error naming the value.
    """
    raw = (annotations or {}).get(WEIGHT_ANNOTATION)
    if raw is None:
        return DEFAULT_WEIGHT
    text = raw.strip()
    if not _WEIGHT_RE.fullmatch(text):
        raise WeightError(
            f"annotation {WEIGHT_ANNOTATION}={raw!r}: want a positive decimal such as 1, 2 or 0.5"
        )
    if "." in text and len(text.split(".", 1)[1]) > 6:
        raise WeightError(
            f"annotation {WEIGHT_ANNOTATION}={raw!r}: at most 6 digits after the point"
        )
    weight = Fraction(text)
    if weight <= 0 or weight > MAX_WEIGHT:
        raise WeightError(f"annotation {WEIGHT_ANNOTATION}={raw!r}: must be > 0 and <= 1000000")
    return weight


@dataclass(frozen=True, slots=True)
class QuotaState:
    """What fair share needs to know about one quota, in integer amounts.

    ``max`` lists only the resources it caps (a resource absent from ``max`` is unbounded,
    as in ElasticQuota); ``min`` absent means 0. ``demand`` is what it would use if every
    pending pod of it ran (used + pending requests); it is raised to ``used`` if lower.
    """

    min: Amounts = field(default_factory=dict)
    max: Amounts = field(default_factory=dict)
    used: Amounts = field(default_factory=dict)
    demand: Amounts = field(default_factory=dict)
    weight: Fraction = DEFAULT_WEIGHT


@dataclass(frozen=True, slots=True)
class FairShare:
    """One quota's entitlement now: ``guaranteed`` (from its min) plus its part of the
    leftover; ``share`` is the sum. ``dominant`` is the largest fraction of any resource's
    capacity that ``share`` is."""

    guaranteed: Shares
    share: Shares
    dominant: Fraction


def _resources(capacity: Amounts, quotas: Mapping[str, QuotaState]) -> list[str]:
    names = set(capacity)
    for q in quotas.values():
        names.update(q.min, q.max, q.used, q.demand)
    return sorted(names)


def _demand(q: QuotaState, r: str) -> int:
    return max(q.demand.get(r, 0), q.used.get(r, 0), 0)


def _guaranteed(
    capacity: Amounts, quotas: Mapping[str, QuotaState], resources: list[str]
) -> dict[str, dict[str, Fraction]]:
    """``min(min, demand)`` per resource, scaled down evenly where they exceed capacity."""
    out: dict[str, dict[str, Fraction]] = {name: {} for name in quotas}
    for r in resources:
        asked = {name: max(0, min(q.min.get(r, 0), _demand(q, r))) for name, q in quotas.items()}
        total = sum(asked.values())
        cap = max(capacity.get(r, 0), 0)
        for name, amount in asked.items():
            if total > cap:
                out[name][r] = Fraction(amount * cap, total)
            else:
                out[name][r] = Fraction(amount)
    return out


def _want(q: QuotaState, r: str, guaranteed: Fraction) -> Fraction:
    """Extra the quota would take beyond its guarantee: demand capped by max."""
    top = _demand(q, r)
    if r in q.max:
        top = min(top, q.max[r])
    return max(Fraction(0), top - guaranteed)


def fair_shares(capacity: Amounts, quotas: Mapping[str, QuotaState]) -> dict[str, FairShare]:
    """Each quota's weighted fair share of ``capacity`` (see the module docstring)."""
    for name, q in quotas.items():
        if q.weight <= 0:
            raise ValueError(f"quota {name}: weight must be positive, got {q.weight}")
    resources = _resources(capacity, quotas)
    cap = {r: max(capacity.get(r, 0), 0) for r in resources}
    guaranteed = _guaranteed(capacity, quotas, resources)
    leftover = {
        r: cap[r] - sum((g[r] for g in guaranteed.values()), Fraction(0)) for r in resources
    }
    want = {
        name: {r: w for r in resources if (w := _want(q, r, guaranteed[name][r])) > 0}
        for name, q in quotas.items()
    }
    extra = _water_fill(cap, leftover, want, {n: q.weight for n, q in quotas.items()})
    out: dict[str, FairShare] = {}
    for name in quotas:
        share = {r: guaranteed[name][r] + extra[name].get(r, Fraction(0)) for r in resources}
        out[name] = FairShare(
            guaranteed=guaranteed[name], share=share, dominant=_dominant(share, cap)
        )
    return out


def _dominant(amounts: Shares, cap: Mapping[str, int]) -> Fraction:
    return max(
        (Fraction(a) / cap[r] for r, a in amounts.items() if cap.get(r, 0) > 0),
        default=Fraction(0),
    )


def _water_fill(
    cap: Mapping[str, int],
    leftover: Mapping[str, Fraction],
    want: Mapping[str, Mapping[str, Fraction]],
    weight: Mapping[str, Fraction],
) -> dict[str, dict[str, Fraction]]:
    """Progressive filling of ``leftover`` along each quota's ``want`` vector.

    A quota ``q`` at level ``s`` holds ``lam_q * want_q`` with ``lam_q = weight_q * s / d_q``
    (``d_q`` the dominant share of its whole want), until it is stopped: fixed ``lam_q`` from
    then on. Each step solves for the next level at which a quota's want is met or a resource
    runs out, and stops the quotas concerned.
    """
    lam: dict[str, Fraction] = {}
    active: dict[str, Fraction] = {}  # name -> d_q
    for name in sorted(want):
        w = want[name]
        if not w:
            continue
        # A want in a resource with no capacity can never be met: the quota cannot grow.
        if any(cap.get(r, 0) <= 0 for r in w):
            lam[name] = Fraction(0)
            continue
        active[name] = max(a / cap[r] for r, a in w.items())
    # Linear coefficients: at level s an active quota uses weight/d * want[r] of r.
    level = Fraction(0)
    while active:
        fixed = {r: sum((lam[n] * want[n].get(r, 0) for n in lam), Fraction(0)) for r in cap}
        slope = {
            r: sum((weight[n] / d * want[n].get(r, 0) for n, d in active.items()), Fraction(0))
            for r in cap
        }
        # Level at which each active quota's want is met, and each resource runs out.
        candidates: list[Fraction] = [d / weight[n] for n, d in active.items()]
        exhausted_at: dict[str, Fraction] = {}
        for r, k in slope.items():
            if k > 0:
                exhausted_at[r] = max(level, (leftover[r] - fixed[r]) / k)
        candidates.extend(exhausted_at.values())
        level = min(candidates)
        stop: set[str] = {n for n, d in active.items() if d / weight[n] <= level}
        for r, at in exhausted_at.items():
            if at <= level:
                stop.update(n for n in active if want[n].get(r, 0) > 0)
        for n in sorted(stop):
            lam[n] = min(Fraction(1), weight[n] * level / active.pop(n))
    return {n: {r: lam.get(n, Fraction(0)) * a for r, a in want[n].items()} for n in want}


def _gap(used: Amounts, share: Shares, capacity: Amounts, sign: int) -> Fraction:
    """``max_r sign * (used_r - share_r) / capacity_r`` over resources with capacity."""
    names = set(used) | set(share)
    return max(
        (
            sign * (used.get(r, 0) - share.get(r, Fraction(0))) / capacity[r]
            for r in names
            if capacity.get(r, 0) > 0
        ),
        default=Fraction(0),
    )


def excess(used: Amounts, share: FairShare, capacity: Amounts) -> Fraction:
    """How far the quota is above its fair share: the largest ``(used - share) / capacity``
    over resources (its dominant over-share); positive means above in some resource."""
    return _gap(used, share.share, capacity, 1)


def deficit(used: Amounts, share: FairShare, capacity: Amounts) -> Fraction:
    """How far the quota is below its fair share: the largest ``(share - used) / capacity``
    over resources; positive means it uses less than its share of some resource it asks
    for (a share never exceeds demand, so the gap is on pending requests)."""
    return _gap(used, share.share, capacity, -1)


def within_share(used: Amounts, request: Amounts, share: FairShare, capacity: Amounts) -> bool:
    """The quota stays within its fair share with ``request`` added to ``used``, in every
    resource the request asks for that the shares divide (those in ``capacity``): fair
    share's second reclaim rule (a quota above its min may take from others for such a
    request), and what keeps the room it reclaimed spoken for."""
    return past_share(used, request, share, capacity) is None


def past_share(used: Amounts, request: Amounts, share: FairShare, capacity: Amounts) -> str | None:
    """The first resource in which ``request`` takes the quota past its fair share (None:
    :func:`within_share`), so that a message can name it."""
    for r, amount in request.items():
        if (
            amount > 0
            and r in capacity
            and used.get(r, 0) + amount > share.share.get(r, Fraction(0))
        ):
            return r
    return None


def clear_of_share(
    used: Amounts,
    resources: Iterable[str],
    share: FairShare,
    capacity: Amounts,
    headroom: Fraction,
) -> bool:
    """The quota uses at most ``1 - headroom`` of its fair share in each of ``resources``
    that the shares divide: clearly below it, not just under it (the second reclaim rule's
    hysteresis)."""
    return near_share(used, resources, share, capacity, headroom) is None


def near_share(
    used: Amounts,
    resources: Iterable[str],
    share: FairShare,
    capacity: Amounts,
    headroom: Fraction,
) -> str | None:
    """The first of ``resources`` in which the quota uses more than ``1 - headroom`` of its
    fair share (None: :func:`clear_of_share`), so that a message can name it."""
    keep = 1 - headroom
    for r in resources:
        if r in capacity and used.get(r, 0) > share.share.get(r, Fraction(0)) * keep:
            return r
    return None


def below_fair_share(used: Amounts, share: FairShare, capacity: Amounts) -> bool:
    """The quota uses less than its fair share of some resource (its pods go first)."""
    return deficit(used, share, capacity) > 0


def reclaim_order(
    capacity: Amounts,
    quotas: Mapping[str, QuotaState],
    shares: Mapping[str, FairShare] | None = None,
) -> list[str]:
    """Quotas above their fair share, furthest above first (by dominant over-share), ties
    by name; the quotas reclaim should take from, in that order."""
    shares = fair_shares(capacity, quotas) if shares is None else shares
    over = [(excess(q.used, shares[n], capacity), n) for n, q in quotas.items()]
    return [n for e, n in sorted(over, key=lambda t: (-t[0], t[1])) if e > 0]


def queue_order(
    capacity: Amounts,
    quotas: Mapping[str, QuotaState],
    shares: Mapping[str, FairShare] | None = None,
) -> list[str]:
    """All quotas, furthest below their fair share first, ties by name: the order in which
    the queue serves pods of equal priority."""
    shares = fair_shares(capacity, quotas) if shares is None else shares
    return sorted(quotas, key=lambda n: (-deficit(quotas[n].used, shares[n], capacity), n))


def total(shares: Iterable[FairShare], resource: str) -> Fraction:
    """Sum of the quotas' shares of one resource (never above capacity)."""
    return sum((s.share.get(resource, Fraction(0)) for s in shares), Fraction(0))


def tenant_ranks(
    capacity: Amounts,
    quotas: Mapping[str, QuotaState],
    shares: Mapping[str, FairShare] | None = None,
) -> dict[str, Fraction]:
    """The queue's rank of each quota, lower first: minus its :func:`deficit`, so the
    tenant furthest below its fair share ranks first and one above it ranks last."""
    shares = fair_shares(capacity, quotas) if shares is None else shares
    return {n: -deficit(q.used, shares[n], capacity) for n, q in quotas.items()}

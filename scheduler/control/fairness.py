"""Fair share on the control side: the queue's tenant ranks under ``spec.quota.policy: Fair``.

The pure computation is :mod:`scheduler.core.fairshare`; this holds its latest answer where
the queue reads it. :meth:`TenantRanks.refresh` takes the quotas as they are (the
:class:`~scheduler.core.quota.QuotaSnapshot` with each namespace's usage), the weights read
from the ElasticQuotas' ``lattice.dev/quota-weight`` annotations (:func:`weights_of`), the
cluster's allocatable totals (each capped by the sum of the quotas' mins, as admission
caps all use: :func:`usable`) and the requests of the pending pods per namespace (demand =
used + pending), and recomputes every rank at once over the resources some quota names;
:meth:`TenantRanks.rank` is the dict lookup the queue makes per namespace at every pop. A
namespace without a quota ranks 0, as does every namespace before the first refresh, which
leaves kube's order unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from scheduler.core.fairshare import (
    FairShare,
    QuotaState,
    WeightError,
    fair_shares,
    parse_weight,
    tenant_ranks,
)
from scheduler.core.quota import QuotaSnapshot, Vector, add

__all__ = ["TenantRanks", "usable", "weights_of"]


def weights_of(bodies: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Fraction], dict[str, str]]:
    """Each ElasticQuota's weight by namespace, and the namespaces whose annotation is bad
    (namespace -> the error): those weigh 1 and the error is reported, never raised."""
    weights: dict[str, Fraction] = {}
    errors: dict[str, str] = {}
    for body in bodies:
        meta = body.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        namespace = str(meta.get("namespace", ""))
        annotations = meta.get("annotations")
        try:
            weights[namespace] = parse_weight(
                {str(k): str(v) for k, v in annotations.items()}
                if isinstance(annotations, Mapping)
                else None
            )
        except WeightError as exc:
            errors[namespace] = f"quota {namespace}/{meta.get('name', '')}: {exc}"
            weights[namespace] = Fraction(1)
    return weights, errors


def usable(quotas: QuotaSnapshot, capacity: Vector) -> dict[str, int]:
    """What the quotas can use together of each resource some quota names: the cluster's
    allocatable, but never more than the sum of the mins, which admission's min rule
    keeps all use under. Shares of capacity nobody may use would let every quota sit
    below its share at once (and so rank, and reclaim, as if it were owed)."""
    named = quotas.named()
    mins = quotas.total_min()
    return {r: min(v, mins.get(r, 0)) for r, v in capacity.items() if r in named}


class TenantRanks:
    """The latest ranks (lower first), one per quota namespace."""

    def __init__(self) -> None:
        self._ranks: dict[str, Fraction] = {}
        self._shares: dict[str, FairShare] = {}
        self._capacity: dict[str, int] = {}

    def rank(self, namespace: str) -> Fraction:
        return self._ranks.get(namespace, Fraction(0))

    def refresh(
        self,
        quotas: QuotaSnapshot,
        weights: Mapping[str, Fraction],
        capacity: Vector,
        pending: Mapping[str, Vector],
    ) -> None:
        """Recompute every rank from the quotas' state now, over the resources some quota
        names (those the min rule governs: a GPU-only quota is not ranked by cpu), of
        which the quotas share what they may use together (:func:`usable`)."""
        named = quotas.named()

        def only(vector: Vector) -> dict[str, int]:
            return {r: v for r, v in vector.items() if r in named}

        states = {
            ns: QuotaState(
                min=only(q.min),
                max=only(q.max),
                used=only(q.used),
                demand=only(add(q.used, pending.get(ns, {}))),
                weight=weights.get(ns, Fraction(1)),
            )
            for ns, q in quotas.quotas.items()
        }
        governed = usable(quotas, capacity)
        self._shares = fair_shares(governed, states)
        self._capacity = dict(governed)
        self._ranks = tenant_ranks(governed, states, self._shares)

    def shares(self) -> tuple[dict[str, FairShare], dict[str, int]] | None:
        """The fair shares of the last refresh (by namespace) and the capacity they divide,
        for reclaim; None before the first refresh."""
        if not self._shares:
            return None
        return dict(self._shares), dict(self._capacity)

    def snapshot(self) -> dict[str, Fraction]:
        return dict(self._ranks)

"""Reclaim: preemption across ElasticQuotas, with scheduler-plugins CapacityScheduling's
victim rules, for :mod:`scheduler.core.preemption` to apply.

Theory of operation (CapacityScheduling's ``SelectVictimsOnNode``; the quota arithmetic is
:mod:`scheduler.core.quota`'s, exact integers):

* A preemptor whose namespace has **no quota** may evict only lower-priority pods of
  namespaces without one: pods under a quota are protected by it.
* A preemptor whose quota would go **above its min** with it (``used + request``, plus the
  requests of pods nominated in the same quota with at least its priority:
  :func:`~scheduler.core.quota.more_than_min_with`) may evict only **lower-priority pods of
  its own quota**.
* A preemptor whose quota stays **within its min** with it may evict pods of **other
  quotas that use more than their min** (borrowers), whatever their priority: the
  guarantee outranks priority. On each node the pods are taken least important first, and
  a quota's pod is a potential victim only while that quota still borrows with the earlier
  ones gone (a borrower is not emptied for a node that needs less).
* A node is a candidate only when, with the victims gone, the pod passes every filter
  *and* the quota admission (:func:`~scheduler.core.quota.admit`: its quota's ``max``, and
  all quotas together within the sum of their mins) admits it; the reprieve loop re-checks
  both as victims are put back, so a victim stays evicted only when a filter or a quota
  rule needs it gone. This is what lets a pod the quota PreFilter refused (the sum of mins
  is used up by borrowers) reclaim even where nodes still have room.

Gangs: a placed gang is one unit (every member, on any node, or none); its members'
requests leave their quota together.

**Fair share** (when :attr:`Quotas.fair_share` is given, the ``fairshare`` policy): (1)
among the victims of one node, the units of the quota furthest above its fair share
(:func:`~scheduler.core.fairshare.excess`) go first: the reprieve puts back the units of
quotas nearest their share first; and among nodes, right after PodDisruptionBudgets, the
candidate whose victims' quotas are all furthest above their share wins; (2) a preemptor
above its min whose quota stays within its fair share with the pod (in every resource it
asks for that the shares divide: :attr:`Quotas.capacity`), and is clearly below it without
the pod (:data:`RECLAIM_HEADROOM`), may also evict pods of other quotas, each only while
that quota keeps at least its fair share without it (in every such resource the victim
holds), so two quotas never evict each other back and forth.

Pure: a :class:`Ledger` is a per-node copy of the use; nothing else is mutated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Final

from scheduler.core.fairshare import FairShare, excess, near_share, past_share
from scheduler.core.profile import CAPACITY_SCHEDULING
from scheduler.core.quota import (
    Nominated,
    Quota,
    QuotaSnapshot,
    Vector,
    add,
    admit,
    format_amount,
    more_than_min_with,
    pod_request,
    subtract,
    used_over_min,
)
from scheduler.model.pod import Pod

QUOTA_PLUGINS: Final = frozenset({CAPACITY_SCHEDULING})
"""The PreFilter plugins that apply the quota rules: a dry run skips them and checks the
quotas with the victims gone itself (:meth:`Rules.admits`)."""


def held_by(pod: Pod) -> Vector:
    """What a placed pod charges to its quota (released when it is evicted)."""
    return pod_request(pod, bound=True)


def asked_by(pod: Pod) -> Vector:
    """What a pending pod would charge to its quota."""
    return pod_request(pod)


@dataclass(frozen=True)
class Quotas:
    """The quotas as preemption reads them: the admission snapshot, how pods are charged,
    and the fair shares when that policy is on."""

    snapshot: QuotaSnapshot
    held: Callable[[Pod], Vector] = held_by
    asked: Callable[[Pod], Vector] = asked_by
    """The preemptor's (and nominated pods') charge; claims' devices included by the caller."""
    fair_share: Mapping[str, FairShare] | None = None
    """By namespace, each quota's fair share now; None: the policy is off."""
    capacity: Vector = field(default_factory=dict)
    """The cluster's capacity per resource: what distance from a fair share is measured in."""

    @property
    def active(self) -> bool:
        return bool(self.snapshot.quotas) or bool(self.snapshot.invalid)

    def nominated(self, pod: Pod) -> Nominated:
        """``pod``, nominated, as admission counts it."""
        return Nominated.of(
            self.snapshot,
            pod.namespace,
            pod.priority,
            self.asked(pod),
            self.fair_share,
            self.capacity,
        )


class Ledger:
    """The quotas' use during one node's dry run: victims taken out and put back."""

    def __init__(self, quotas: Quotas) -> None:
        self.quotas = quotas
        self.used: dict[str, dict[str, int]] = {
            ns: dict(q.used) for ns, q in quotas.snapshot.quotas.items()
        }

    def take(self, pods: Iterable[Pod]) -> None:
        for pod in pods:
            used = self.used.get(pod.namespace)
            if used is not None:
                self.used[pod.namespace] = subtract(used, self.quotas.held(pod))

    def give(self, pods: Iterable[Pod]) -> None:
        for pod in pods:
            used = self.used.get(pod.namespace)
            if used is not None:
                self.used[pod.namespace] = add(used, self.quotas.held(pod))

    def quota(self, namespace: str) -> Quota:
        return self.quotas.snapshot.quotas[namespace].with_used(self.used[namespace])

    def snapshot(self) -> QuotaSnapshot:
        base = self.quotas.snapshot
        quotas = {ns: q.with_used(self.used[ns]) for ns, q in base.quotas.items()}
        return QuotaSnapshot(MappingProxyType(quotas), base.invalid)


RECLAIM_HEADROOM: Final = Fraction(1, 10)
"""Fair share's second rule takes from another quota only for a quota clearly below its
fair share before the pod (using at most ``1 - RECLAIM_HEADROOM`` of it, its nominated pods
counted in, in every resource the pod asks for that the shares divide) that stays within
its share with the pod: hysteresis (KAI's ``reclaimerUtilizationMultiplier`` serves the
same end). Without it, two quotas near their shares traded pods whenever arrivals and
departures moved them by one pod: at 32 nodes about a fifth of all pods were evicted once
(`just bench-quota --nodes 32`), most between the two tenants sharing the leftover; with
it, 453 evictions against 1032 over seeds 1-4, every tenant still within 4.5 % of its share
(docs/quotas.md). A quota nearer its share than this waits for room to free, which the
fair queue order gives it first."""


@dataclass(frozen=True)
class Rules:
    """The reclaim rules for one preemptor (see the module docstring)."""

    quotas: Quotas
    pod: Pod
    own: Quota | None
    request: Vector
    nominated: tuple[Nominated, ...]
    above_min: bool
    """The pod's quota goes above its min with it: only its own lower-priority pods go."""
    within_share: bool
    """Fair share on, and the pod's quota stays within its fair share with it."""
    held_back: str | None = None
    """Why the pod may take nothing from other quotas, for its FailedScheduling message
    (None: it may, or it has no quota): a user whose pod waits beside borrowed capacity
    should read which rule kept it from reclaiming."""

    @classmethod
    def of(
        cls,
        quotas: Quotas,
        pod: Pod,
        nominated: Sequence[tuple[Pod, str]],
        *,
        request: Vector | None = None,
        what: str = "pod",
    ) -> Rules:
        """The rules for ``pod`` (``request``: what it charges, if not its own request: a
        gang's sum; ``what``: the preemptor as :attr:`held_back` names it)."""
        snapshot = quotas.snapshot
        own = snapshot.of(pod.namespace)
        request = quotas.asked(pod) if request is None else request
        pending = tuple(
            quotas.nominated(other)
            for other, _ in nominated
            if other.key != pod.key and snapshot.of(other.namespace) is not None
        )
        same = add(
            request,
            *(
                n.request
                for n in pending
                if n.namespace == pod.namespace and n.priority >= pod.priority
            ),
        )
        above_min = own is not None and more_than_min_with(own, same, governed=snapshot.named())
        share = None if quotas.fair_share is None else quotas.fair_share.get(pod.namespace)
        if own is None:
            return cls(quotas, pod, own, request, pending, above_min, False)
        past = near = None
        before = add(own.used, subtract(same, request))
        if share is not None:
            past = past_share(own.used, same, share, quotas.capacity)
            if past is None:
                asked = (name for name, amount in request.items() if amount > 0)
                near = near_share(before, asked, share, quotas.capacity, RECLAIM_HEADROOM)
        within = share is not None and past is None and near is None
        held_back = None
        if above_min and not within:
            why = f"quota {own.key} goes above its min with the {what}"
            if share is not None and past is not None:
                with_it = format_amount(past, own.used.get(past, 0) + same[past])
                why += (
                    f" and past its fair share of {_share(past, share)} {past} ({with_it} with it):"
                )
            elif share is not None and near is not None:
                why += (
                    f" and already uses {format_amount(near, before.get(near, 0))} of its fair "
                    f"share of {_share(near, share)} {near}: fair share takes from other "
                    f"quotas only for a quota using at most {1 - RECLAIM_HEADROOM} of its share;"
                )
            else:
                why += ":"
            held_back = f"{why} only its own quota's lower-priority pods may be preempted"
        return cls(quotas, pod, own, request, pending, above_min, within, held_back)

    def noted(self, message: str) -> str:
        """``message`` (a FailedScheduling text) with :attr:`held_back` after it, if any:
        Lattice beyond kube, which quota rule kept the preemptor from other quotas' pods."""
        if self.held_back is None:
            return message
        end = " " if message.endswith(".") else ". "
        return f"{message}{end}Reclaim: {self.held_back}."

    @property
    def governed(self) -> frozenset[str]:
        """The resources the min rule governs (some quota names them): only these make a
        quota a borrower or take a preemptor past its min, as in admission."""
        return self.quotas.snapshot.named()

    @property
    def fair(self) -> bool:
        return self.quotas.fair_share is not None

    def ledger(self) -> Ledger:
        return Ledger(self.quotas)

    def admits(self, ledger: Ledger) -> bool:
        """The quota admission with the ledger's use (always True without a quota of its
        own: nothing to check)."""
        if self.own is None and not self.quotas.snapshot.governs(self.pod.namespace):
            return True
        verdict = admit(
            ledger.snapshot(),
            self.pod.namespace,
            self.request,
            priority=self.pod.priority,
            nominated=self.nominated,
        )
        return verdict.admitted

    def may_take(self, unit: Sequence[Pod], ledger: Ledger) -> bool:
        """Whether ``unit`` (one pod, or a gang's placed members) is a potential victim with
        the ledger's use (the node's earlier potential victims already taken)."""
        namespaces = {p.namespace for p in unit}
        if len(namespaces) != 1:
            return False
        (ns,) = namespaces
        has_quota = self.quotas.snapshot.governs(ns)
        lower = all(p.priority < self.pod.priority for p in unit)
        if self.own is None:
            return not has_quota and lower
        if ns not in ledger.used:
            return False
        if ns == self.pod.namespace:
            return self.above_min and lower
        if not self.above_min:
            return used_over_min(ledger.quota(ns), governed=self.governed)
        if self.within_share:
            return self._keeps_share(ns, unit, ledger)
        return False

    def _keeps_share(self, ns: str, unit: Sequence[Pod], ledger: Ledger) -> bool:
        """Fair share's rule: ``ns`` keeps at least its fair share without ``unit`` in every
        resource the unit holds."""
        shares = self.quotas.fair_share
        share = None if shares is None else shares.get(ns)
        if share is None:
            return False
        held = add(*(self.quotas.held(p) for p in unit))
        left = subtract(ledger.used[ns], held)
        governed = {n: a for n, a in held.items() if a > 0 and n in self.quotas.capacity}
        return bool(governed) and all(
            left.get(name, 0) >= share.share.get(name, Fraction(0)) for name in governed
        )

    def could_take_unit(self, unit: Sequence[Pod]) -> bool:
        """:meth:`may_take` for a unit on the use as it is."""
        return self.may_take(unit, self.ledger())

    def could_take(self, other: Pod) -> bool:
        """:meth:`may_take` on the use as it is: is a terminating pod one this pod could
        have evicted (so that its room is what the pod waits for)?"""
        return self.may_take((other,), self.ledger())

    def excess(self, namespace: str) -> Fraction:
        """How far the namespace's quota is above its fair share (:func:`fairshare.excess`,
        negative below); zero when fair share is off or it has no quota."""
        shares = self.quotas.fair_share
        share = None if shares is None else shares.get(namespace)
        quota = self.quotas.snapshot.of(namespace)
        if share is None or quota is None:
            return Fraction(0)
        return excess(quota.used, share, self.quotas.capacity)


def _share(resource: str, share: FairShare) -> str:
    """A quota's fair share of ``resource`` as a quantity, rounded down to its unit."""
    amount = share.share.get(resource, Fraction(0))
    return format_amount(resource, amount.numerator // amount.denominator)


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """A victim taken from another quota: what its event says and whom its metric counts."""

    namespace: str
    quota: str
    """The victim's quota (its name; :attr:`namespace` is the namespace)."""
    message: str


def reclaimed(
    rules: Rules | None,
    victims: Sequence[Pod],
    node: str,
    *,
    preemptor: str | None = None,
) -> dict[str, Reclaimed]:
    """By victim :attr:`Pod.key`, the victims of the preemption ``rules`` applied that
    reclaim took from another quota (a pod of its own quota, or of none, is plain
    preemption), each with the message of its ``Preempted`` event naming the reclaiming
    quota and pod (``preemptor``: what to name instead of the pod, e.g. its PodGroup) and
    the rule that took it: the min rule (the preemptor's quota within its min, the victim's
    borrowing) or fair share's (above its min, within its share; the victim's above it)."""
    if rules is None or rules.own is None:
        return {}
    pod, own, snapshot = rules.pod, rules.own, rules.quotas.snapshot
    why = "was above its fair share" if rules.above_min else "used more than its min"
    out: dict[str, Reclaimed] = {}
    for victim in victims:
        theirs = snapshot.of(victim.namespace)
        if theirs is None or victim.namespace == pod.namespace:
            continue
        out[victim.key] = Reclaimed(
            theirs.namespace,
            theirs.name,
            f"Reclaimed by ElasticQuota {own.key} for "
            f"{preemptor or f'pod {pod.namespace}/{pod.name}'} on node "
            f"{node}: quota {theirs.key} {why}",
        )
    return out

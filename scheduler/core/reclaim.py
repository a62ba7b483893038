"""Reclaim: preemption across ElasticQuotas, with scheduler-plugins CapacityScheduling's
victim rules, for :mod:`scheduler.core.preemption` to apply.

Theory of operation (CapacityScheduling's ``SelectVictimsOnNode``, read from
``pkg/capacityscheduling``; the arithmetic is Lattice's, exact integers):

* A preemptor whose namespace has **no quota** may evict only lower-priority pods of
  namespaces without one: pods under a quota are protected by it.
* A preemptor whose quota would go **above its min** with it (``used + request`` and the
  requests of pods nominated in the same quota with at least its priority, in cpu, memory
  or any resource it asks for) may evict only **lower-priority pods of its own quota**.
* A preemptor whose quota stays **within its min** with it may evict pods of **other
  quotas that use more than their min** (borrowers), whatever their priority: the
  guarantee outranks priority. On each node the pods are taken least important first,
  and a quota's pod is a candidate only while that quota is still above its min with the
  earlier candidates gone (so a borrower is not emptied for a node that needs less).
* A node is a candidate only when, with the victims gone, the pod passes every filter
  *and* the quota rules admit it: its quota's ``used + request`` within ``max`` (every
  resource absent from ``max`` unbounded), and the use of all quotas together within the
  sum of their mins (:attr:`Quotas.total`). The reprieve loop re-checks both as victims
  are put back, so a victim stays only when either rule needs it gone.

Gangs: a placed gang is one unit (every member, on any node, or none); its members'
requests leave their quota together.

**Fair share** (when :attr:`Quotas.fair_share` is given, the ``fairshare`` policy): (1)
among the victims a node could give, those of the quota furthest above its fair share go
first (the reprieve puts back the pods of quotas nearest their share first), and among
nodes, the one whose victims all come from quotas furthest above their share wins right
after PodDisruptionBudgets; (2) a preemptor above its min but whose quota stays within its
fair share with the pod may also evict pods of other quotas above their fair share, each
only while that quota keeps at least its fair share without the pod (in every resource
the pod holds), so two quotas never evict each other back and forth.

Pure: a :class:`Ledger` is a per-node copy of the use; nothing else is mutated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Final

from scheduler.model.names import CPU, MEMORY
from scheduler.model.pod import Pod

Amounts = Mapping[str, int]

QUOTA_PLUGINS: Final = frozenset({"CapacityScheduling"})
"""The PreFilter plugins that apply the quota rules: a dry run skips them and checks the
quotas with the victims gone itself (:meth:`Rules.admits`)."""

ALWAYS_COMPARED: Final = (CPU, MEMORY)
"""CapacityScheduling compares cpu and memory whatever the pod asks for, other resources
only where the pod asks for them."""


def pod_usage(pod: Pod) -> Amounts:
    """What a pod counts against its quota: its requests (containers, the largest init
    container, overhead), as the cycle sees them."""
    return pod.resources.requests


@dataclass(frozen=True, slots=True)
class QuotaEntry:
    """One namespace's ElasticQuota as reclaim reads it."""

    key: str
    """``namespace/name``, as events and metrics name it."""
    min: Amounts
    max: Amounts
    """A resource absent from ``max`` is unbounded."""
    used: Amounts


@dataclass(frozen=True)
class Quotas:
    """Every quota by namespace, and how pods are counted against them."""

    by_namespace: Mapping[str, QuotaEntry]
    usage: Callable[[Pod], Amounts] = pod_usage
    total: Amounts | None = None
    """What the quotas together may use; None: the sum of their mins (CapacityScheduling)."""
    fair_share: Mapping[str, Mapping[str, Fraction]] | None = None
    """By namespace, each quota's fair share now; None: the policy is off."""
    capacity: Amounts = field(default_factory=dict)
    """The cluster's capacity per resource: what distance from a fair share is measured in."""

    def quota_of(self, pod: Pod) -> QuotaEntry | None:
        return self.by_namespace.get(pod.namespace)

    def fair_share_of(self, namespace: str) -> Mapping[str, Fraction] | None:
        if self.fair_share is None:
            return None
        return self.fair_share.get(namespace)

    def limit_total(self) -> dict[str, int]:
        if self.total is not None:
            return dict(self.total)
        out: dict[str, int] = {}
        for q in self.by_namespace.values():
            add_into(out, q.min)
        return out


def add_into(into: dict[str, int], amounts: Amounts, sign: int = 1) -> None:
    for name, amount in amounts.items():
        into[name] = into.get(name, 0) + sign * amount


def over(used: Amounts, limit: Amounts) -> bool:
    """CapacityScheduling's ``cmp``: above ``limit`` in some resource ``used`` holds (a
    resource absent from ``limit`` counts as 0)."""
    return any(amount > limit.get(name, 0) for name, amount in used.items())


def over_with(used: Amounts, extra: Amounts, limit: Amounts, *, unbounded: bool) -> bool:
    """CapacityScheduling's ``cmp2``: ``used + extra`` above ``limit`` in cpu, memory or a
    resource ``extra`` asks for. ``unbounded``: a resource absent from ``limit`` has no
    limit (``max``), else it is 0 (``min``)."""
    names = set(ALWAYS_COMPARED) | {n for n, a in extra.items() if a > 0}
    for name in names:
        if unbounded and name not in limit:
            continue
        if used.get(name, 0) + extra.get(name, 0) > limit.get(name, 0):
            return True
    return False


class Ledger:
    """The quotas' use during one node's dry run: victims taken out and put back."""

    def __init__(self, quotas: Quotas) -> None:
        self.quotas = quotas
        self.used: dict[str, dict[str, int]] = {
            ns: dict(q.used) for ns, q in quotas.by_namespace.items()
        }

    def take(self, pods: Iterable[Pod]) -> None:
        self._shift(pods, -1)

    def give(self, pods: Iterable[Pod]) -> None:
        self._shift(pods, +1)

    def _shift(self, pods: Iterable[Pod], sign: int) -> None:
        for pod in pods:
            used = self.used.get(pod.namespace)
            if used is not None:
                add_into(used, self.quotas.usage(pod), sign)

    def over_min(self, namespace: str) -> bool:
        return over(self.used[namespace], self.quotas.by_namespace[namespace].min)

    def total(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for used in self.used.values():
            add_into(out, used)
        return out


@dataclass(frozen=True)
class Rules:
    """The reclaim rules for one preemptor (see the module docstring)."""

    quotas: Quotas
    pod: Pod
    own: QuotaEntry | None
    request: Amounts
    in_quota: Amounts
    """The pod's request plus those of pods nominated in its quota with >= its priority."""
    everywhere: Amounts
    """``in_quota`` plus the nominated pods of other quotas within their min."""
    above_min: bool
    """The pod's quota goes above its min with it: only its own lower-priority pods go."""
    within_share: bool
    """Fair share on, and the pod's quota stays within its fair share with it."""

    @classmethod
    def of(cls, quotas: Quotas, pod: Pod, nominated: Sequence[tuple[Pod, str]]) -> Rules:
        own = quotas.quota_of(pod)
        request = dict(quotas.usage(pod))
        in_quota = dict(request)
        everywhere = dict(request)
        for other, _ in nominated:
            if other.key == pod.key:
                continue
            theirs = quotas.quota_of(other)
            if theirs is None:
                continue
            usage = quotas.usage(other)
            if other.namespace == pod.namespace and other.priority >= pod.priority:
                add_into(in_quota, usage)
                add_into(everywhere, usage)
            elif other.namespace != pod.namespace and not over(theirs.used, theirs.min):
                add_into(everywhere, usage)
        above_min = own is not None and over_with(own.used, in_quota, own.min, unbounded=False)
        within_share = False
        share = None if own is None else quotas.fair_share_of(pod.namespace)
        if own is not None and share is not None:
            within_share = all(
                own.used.get(name, 0) + amount <= share.get(name, Fraction(0))
                for name, amount in in_quota.items()
                if amount > 0
            )
        return cls(quotas, pod, own, request, in_quota, everywhere, above_min, within_share)

    def ledger(self) -> Ledger:
        return Ledger(self.quotas)

    def admits(self, ledger: Ledger) -> bool:
        """The quota rules with the ledger's use: the pod's quota within ``max``, all quotas
        together within :meth:`Quotas.limit_total`."""
        if self.own is None:
            return True
        ns = self.pod.namespace
        if over_with(ledger.used[ns], self.in_quota, self.own.max, unbounded=True):
            return False
        total = ledger.total()
        add_into(total, self.everywhere)
        return not over(total, self.quotas.limit_total())

    def may_take(self, unit: Sequence[Pod], ledger: Ledger) -> bool:
        """Whether ``unit`` (one pod, or a gang's placed members) is a potential victim with
        the ledger's use (earlier potential victims of the node already taken)."""
        namespaces = {p.namespace for p in unit}
        if len(namespaces) != 1:
            return False
        (ns,) = namespaces
        quotas = self.quotas.by_namespace
        lower = all(p.priority < self.pod.priority for p in unit)
        if self.own is None:
            return ns not in quotas and lower
        if ns not in quotas:
            return False
        if ns == self.pod.namespace:
            return self.above_min and lower
        if not self.above_min:
            return ledger.over_min(ns)
        if self.within_share:
            return self._keeps_share(ns, unit, ledger)
        return False

    def _keeps_share(self, ns: str, unit: Sequence[Pod], ledger: Ledger) -> bool:
        """The fair-share rule: ``ns`` keeps at least its fair share without ``unit`` in
        every resource the unit holds."""
        share = self.quotas.fair_share_of(ns)
        if share is None:
            return False
        left = dict(ledger.used[ns])
        held: dict[str, int] = {}
        for p in unit:
            add_into(held, self.quotas.usage(p))
        add_into(left, held, -1)
        return any(a > 0 for a in held.values()) and all(
            left.get(name, 0) >= share.get(name, Fraction(0))
            for name, amount in held.items()
            if amount > 0
        )

    def could_take(self, other: Pod) -> bool:
        """:meth:`may_take` with the use as it is (is a terminating pod one this pod could
        have evicted, so that its room is what the pod waits for?)."""
        return self.may_take((other,), self.ledger())

    def excess(self, namespace: str) -> Fraction:
        """How far the quota is above its fair share: the largest excess over any resource,
        as a fraction of the cluster's capacity of it (negative: below its share). Zero when
        fair share is off or the namespace has no quota."""
        share = self.quotas.fair_share_of(namespace)
        q = self.quotas.by_namespace.get(namespace)
        if share is None or q is None:
            return Fraction(0)
        best: Fraction | None = None
        for name, cap in self.quotas.capacity.items():
            if cap <= 0:
                continue
            value = (q.used.get(name, 0) - share.get(name, Fraction(0))) / cap
            best = value if best is None or value > best else best
        return best if best is not None else Fraction(0)

    @property
    def fair(self) -> bool:
        return self.quotas.fair_share is not None

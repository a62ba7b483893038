"""Affinity terms as graph vertices: canonical identity, the two matching rules, anchors.

A :class:`TermKey` is one distinct (namespace set, namespace selector, label selector,
topology key) — or, for a topology spread constraint, (namespace, label selector, topology
key) with spread counting rules. Requirements and values are sorted and deduplicated, so
pods that write the same term differently share one vertex; its id is a readable string.

kube-scheduler matches a term two ways, and both are here:

* :func:`selects` — the term belongs to the pod being scheduled and is tested against a
  placed pod (``AffinityTerm.Matches`` after the namespace selector was merged into the
  namespace list). The namespace selector is also evaluated against an empty label set, so
  one that matches ``{}`` (``{}``, NotIn, DoesNotExist) selects every namespace. Spread
  terms count only live (not terminating) pods of their own namespace, and an empty
  selector counts nothing (``countPodsMatchSelector``).
* :func:`selected_by` — the term belongs to a placed pod and is tested against the pod being
  scheduled, with that pod's namespace labels and no empty-set quirk.

The *anchor* of a term is one label condition every pod it selects must satisfy (an ``In``
requirement, else an ``Exists``), so candidate terms for a pod, or candidate pods for a
term, are found by label lookups instead of scans.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from scheduler.model.pod import PodAffinityTerm, TopologySpreadConstraint
from scheduler.model.selectors import NOTHING, LabelSelector, Operator, Requirement

Labels = Mapping[str, str]
_EMPTY: Final[Labels] = {}
_OPS: Final = {
    Operator.IN: "in",
    Operator.NOT_IN: "notin",
    Operator.GT: "gt",
    Operator.LT: "lt",
}


def _canonical(selector: LabelSelector) -> LabelSelector:
    if selector.selects_nothing:
        return NOTHING
    reqs = {
        Requirement(r.key, r.operator, tuple(sorted(set(r.values))), r.int_value)
        for r in selector.requirements
    }
    return LabelSelector(tuple(sorted(reqs, key=lambda r: (r.key, r.operator.value, r.values))))


def render_selector(selector: LabelSelector) -> str:
    """kubectl-like text: ``app in (web), tier``; ``<none>`` and ``<all>`` for nil and {}."""
    if selector.selects_nothing:
        return "<none>"
    if not selector.requirements:
        return "<all>"
    parts = []
    for r in selector.requirements:
        if r.operator is Operator.EXISTS:
            parts.append(r.key)
        elif r.operator is Operator.DOES_NOT_EXIST:
            parts.append(f"!{r.key}")
        else:
            parts.append(f"{r.key} {_OPS[r.operator]} ({','.join(r.values)})")
    return ", ".join(parts)


class TermKey:
    """The identity of a term vertex; equal keys mean the same vertex (compared by ``vid``)."""

    __slots__ = (
        "anchor",
        "namespace_selector",
        "namespaces",
        "never",
        "ns_matches_empty",
        "ns_sensitive",
        "selector",
        "spread",
        "topology_key",
        "vid",
    )

    def __init__(
        self,
        selector: LabelSelector,
        namespaces: Iterable[str],
        namespace_selector: LabelSelector,
        topology_key: str,
        *,
        spread: bool = False,
    ) -> None:
        self.selector = _canonical(selector)
        self.namespaces = frozenset(namespaces)
        self.namespace_selector = _canonical(namespace_selector)
        self.topology_key = topology_key
        self.spread = spread
        self.ns_matches_empty = self.namespace_selector.matches(_EMPTY)
        self.ns_sensitive = (
            not spread and not self.namespace_selector.selects_nothing and not self.ns_matches_empty
        )
        """Whether :func:`selects` depends on the placed pod's namespace labels."""
        self.never = self.selector.selects_nothing or (spread and self.selector.is_empty)
        """The term selects no pod at all."""
        self.anchor = _anchor(self.selector)
        ns = ",".join(sorted(self.namespaces))
        sel = render_selector(self.selector)
        if spread:
            self.vid = f"term/spread ns={ns} sel={sel} @ {topology_key}"
        else:
            nss = render_selector(self.namespace_selector)
            self.vid = f"term/ns={ns} nssel={nss} sel={sel} @ {topology_key}"

    @classmethod
    def of_affinity(cls, term: PodAffinityTerm) -> TermKey:
        """The key of a pod (anti-)affinity term; memoised (see :data:`_MEMO_LIMIT`)."""
        key = _AFFINITY_MEMO.get(term)
        if key is None:
            if len(_AFFINITY_MEMO) >= _MEMO_LIMIT:
                _AFFINITY_MEMO.clear()
            key = _AFFINITY_MEMO[term] = cls(
                term.selector, term.namespaces, term.namespace_selector, term.topology_key
            )
        return key

    @classmethod
    def of_spread(cls, constraint: TopologySpreadConstraint, namespace: str) -> TermKey:
        """The key of a spread constraint of a pod in ``namespace``; memoised."""
        memo = (constraint, namespace)
        key = _SPREAD_MEMO.get(memo)
        if key is None:
            if len(_SPREAD_MEMO) >= _MEMO_LIMIT:
                _SPREAD_MEMO.clear()
            key = _SPREAD_MEMO[memo] = cls(
                constraint.selector, (namespace,), NOTHING, constraint.topology_key, spread=True
            )
        return key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TermKey) and other.vid == self.vid

    def __hash__(self) -> int:
        return hash(self.vid)

    def __repr__(self) -> str:
        return f"TermKey({self.vid[5:]!r})"


_MEMO_LIMIT: Final = 4096
"""Distinct terms remembered by :meth:`TermKey.of_affinity` / :meth:`TermKey.of_spread`:
replicas declare equal (hashable, frozen) terms, so each pod's cycles and graph patches
reuse one key instead of canonicalising and rendering the selector again (about 70 µs a
term). Past the limit the memo starts over; keys are immutable, so sharing is safe."""
_AFFINITY_MEMO: dict[PodAffinityTerm, TermKey] = {}
_SPREAD_MEMO: dict[tuple[TopologySpreadConstraint, str], TermKey] = {}


def _anchor(selector: LabelSelector) -> tuple[str, tuple[str, ...]] | None:
    """``(key, values)`` of the narrowest In requirement, ``(key, ())`` for an Exists one."""
    best: Requirement | None = None
    for r in selector.requirements:
        if r.operator is Operator.IN and (best is None or len(r.values) < len(best.values)):
            best = r
    if best is not None:
        return best.key, best.values
    for r in selector.requirements:
        if r.operator is Operator.EXISTS:
            return r.key, ()
    return None


def selects(
    term: TermKey,
    namespace: str,
    labels: Labels,
    namespace_labels: Labels | None,
    terminating: bool = False,
) -> bool:
    """A term of the pod being scheduled selects a placed pod (kube's ``Matches``)."""
    if term.never:
        return False
    if term.spread:
        return not terminating and namespace in term.namespaces and term.selector.matches(labels)
    if not (
        namespace in term.namespaces
        or term.ns_matches_empty
        or (term.ns_sensitive and term.namespace_selector.matches(namespace_labels or _EMPTY))
    ):
        return False
    return term.selector.matches(labels)


def selected_by(
    term: TermKey, namespace: str, labels: Labels, namespace_labels: Labels | None
) -> bool:
    """A term of a placed pod selects the pod being scheduled."""
    if term.spread or term.selector.selects_nothing:
        return False
    if namespace not in term.namespaces and not term.namespace_selector.matches(
        namespace_labels or _EMPTY
    ):
        return False
    return term.selector.matches(labels)


class AnchorIndex:
    """Term vertices by anchor, answering "which terms could select these labels?"."""

    __slots__ = ("_by_key", "_by_pair", "_free")

    def __init__(self) -> None:
        self._by_pair: dict[tuple[str, str], set[str]] = {}
        self._by_key: dict[str, set[str]] = {}
        self._free: set[str] = set()

    def add(self, term: TermKey) -> None:
        for bucket in self._buckets(term, create=True):
            bucket.add(term.vid)

    def discard(self, term: TermKey) -> None:
        for bucket in self._buckets(term, create=False):
            bucket.discard(term.vid)
        if term.anchor is not None:
            key, values = term.anchor
            for value in values:
                if not self._by_pair.get((key, value), True):
                    del self._by_pair[(key, value)]
            if not values and not self._by_key.get(key, True):
                del self._by_key[key]

    def _buckets(self, term: TermKey, *, create: bool) -> list[set[str]]:
        if term.never:
            return []
        if term.anchor is None:
            return [self._free]
        key, values = term.anchor
        out = []
        if values:
            for value in values:
                bucket = self._by_pair.get((key, value))
                if bucket is None and create:
                    bucket = self._by_pair[(key, value)] = set()
                if bucket is not None:
                    out.append(bucket)
        else:
            bucket = self._by_key.get(key)
            if bucket is None and create:
                bucket = self._by_key[key] = set()
            if bucket is not None:
                out.append(bucket)
        return out

    def candidates(self, labels: Labels) -> set[str]:
        """Terms whose anchor these labels satisfy (a superset of the terms selecting them)."""
        out = set(self._free)
        by_pair, by_key = self._by_pair, self._by_key
        for item in labels.items():
            hit = by_pair.get(item)
            if hit:
                out |= hit
            hit = by_key.get(item[0])
            if hit:
                out |= hit
        return out

    def view(self) -> dict[str, Any]:
        return {
            "pairs": {k: set(v) for k, v in self._by_pair.items()},
            "keys": {k: set(v) for k, v in self._by_key.items()},
            "free": set(self._free),
        }

"""A pod's life in the scheduler cache, as one transition table.

The cache counts a pod against its node's capacity from the moment the scheduler *assumes*
it there (before the binding is even sent, so the next cycle does not hand the same room to
another pod) until the pod is removed. Which events may follow which is kube-scheduler's
cache state machine (``pkg/scheduler/backend/cache/interface.go``), made explicit:
:data:`TRANSITIONS` is the only place it is written down; :func:`format_table` renders it (all
pairs, illegal ones included) for docs and the CLI.

Theory of operation
-------------------
* **INITIAL** means "not in the cache". kube-scheduler's *Expired*, *Forgotten* and *Deleted*
  hold nothing either, so here they are INITIAL reached by ``EXPIRE``, ``FORGET`` and
  ``REMOVE``; the machine keeps no record of absent pods, so memory follows the cluster.
* **ASSUMED**: the scheduler chose a node and the binding is in flight. **BOUND**: the
  binding call succeeded but the watch has not shown it yet; only now may the pod expire
  (after ``assumed_ttl``, if set), because an in-flight binding may still succeed.
  **ADDED**: the watch shows the pod bound; the watch is the truth from here on.
* ASSUMED, BOUND and ADDED count against the node's capacity; each :class:`Transition` says
  which node's capacity it releases and which it claims, so the cache adjusts its per-node
  sums without re-deriving them.
* A pod bound by someone else enters directly as ADDED. The watch may overtake our own calls
  (the bound pod shows up before the binding call returns), so those orders are legal no-ops.
* Anything else is illegal: :class:`IllegalTransitionError` is raised and nothing changes.
  It means a bug or a missed watch event; the shell logs it and carries on.

Pure: no I/O, no clock (callers pass ``now``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from scheduler.control.queue import PodKey


class PodState(enum.StrEnum):
    """Values double as the ``state`` label of the cached-pods gauge."""

    INITIAL = "initial"
    ASSUMED = "assumed"
    BOUND = "bound"
    ADDED = "added"

    @property
    def counts_capacity(self) -> bool:
        return self is not PodState.INITIAL


class PodEvent(enum.StrEnum):
    ASSUME = "assume"
    """The scheduler placed the pod on a node (before binding)."""
    FINISH_BINDING = "finish_binding"
    """The binding call succeeded; the expiry clock starts."""
    FORGET = "forget"
    """The binding call failed; give the room back."""
    EXPIRE = "expire"
    """Bound, but the watch never confirmed it within the TTL."""
    ADD = "add"
    """The watch shows the pod bound to a node (first sighting)."""
    UPDATE = "update"
    """The watch shows a change of a pod it already showed bound."""
    REMOVE = "remove"
    """The watch shows the pod deleted."""


_NEEDS_NODE: Final = frozenset({PodEvent.ASSUME, PodEvent.ADD, PodEvent.UPDATE})


@dataclass(frozen=True, slots=True)
class Rule:
    target: PodState
    why: str


S, E = PodState, PodEvent

TRANSITIONS: Final[Mapping[tuple[PodState, PodEvent], Rule]] = MappingProxyType(
    {
        (S.INITIAL, E.ASSUME): Rule(S.ASSUMED, "scheduled: count it before binding"),
        (S.INITIAL, E.ADD): Rule(S.ADDED, "bound by someone else, or back after expiry"),
        (S.INITIAL, E.FINISH_BINDING): Rule(S.INITIAL, "race: watch added and removed it"),
        (S.ASSUMED, E.FINISH_BINDING): Rule(S.BOUND, "binding succeeded; TTL starts"),
        (S.ASSUMED, E.FORGET): Rule(S.INITIAL, "binding failed: Forgotten"),
        (S.ASSUMED, E.ADD): Rule(
            S.ADDED, "watch confirmed before the binding returned; its node wins"
        ),
        (S.ASSUMED, E.REMOVE): Rule(S.INITIAL, "the watch skipped the add: Deleted"),
        (S.BOUND, E.ADD): Rule(S.ADDED, "confirmed"),
        (S.BOUND, E.EXPIRE): Rule(S.INITIAL, "no confirmation within the TTL: Expired"),
        (S.BOUND, E.REMOVE): Rule(S.INITIAL, "the watch skipped the add: Deleted"),
        (S.ADDED, E.UPDATE): Rule(S.ADDED, "same node (nodeName is immutable)"),
        (S.ADDED, E.REMOVE): Rule(S.INITIAL, "Deleted"),
        (S.ADDED, E.FINISH_BINDING): Rule(S.ADDED, "race: watch confirmed first"),
        (S.ADDED, E.FORGET): Rule(S.ADDED, "race: binding reported failure but happened"),
    }
)
"""(state, event) -> next state. A pair that is missing is illegal."""

del S, E


class IllegalTransitionError(Exception):
    """An event that the table forbids in the pod's state: a bug or a missed watch event."""

    def __init__(self, key: PodKey, state: PodState, event: PodEvent, detail: str = "") -> None:
        self.key = key
        self.state = state
        self.event = event
        super().__init__(
            f"pod {key}: {event.value} is illegal in state {state.value}"
            + (f" ({detail})" if detail else "")
        )


class NodeMismatchError(IllegalTransitionError):
    """An update moved an added pod to another node, which Kubernetes never does."""

    def __init__(self, key: PodKey, state: PodState, event: PodEvent, known: str, got: str):
        self.known = known
        self.got = got
        super().__init__(key, state, event, f"on node {known}, update says {got}")


@dataclass(frozen=True, slots=True)
class PodRecord:
    state: PodState
    node: str
    deadline: float | None = None
    """When a BOUND pod may expire; None: never (no TTL, or not bound)."""


@dataclass(frozen=True, slots=True)
class Transition:
    """What one event did, with its capacity effect for the cache's per-node sums."""

    key: PodKey
    event: PodEvent
    before: PodState
    after: PodState
    node_before: str | None
    node_after: str | None

    @property
    def released(self) -> str | None:
        """The node whose capacity this pod no longer uses, if any."""
        if self.before.counts_capacity and (
            not self.after.counts_capacity or self.node_before != self.node_after
        ):
            return self.node_before
        return None

    @property
    def claimed(self) -> str | None:
        """The node whose capacity this pod now uses and did not before, if any."""
        if self.after.counts_capacity and (
            not self.before.counts_capacity or self.node_before != self.node_after
        ):
            return self.node_after
        return None


class PodLifecycle:
    """Each cached pod's state and node; every change goes through :data:`TRANSITIONS`."""

    def __init__(self, *, assumed_ttl: float | None = None) -> None:
        """``assumed_ttl``: seconds a BOUND pod waits for the watch before it expires. None
        (kube-scheduler's default) never expires: the binding did happen, so
        dropping the pod would under-count the node until the watch catches up."""
        if assumed_ttl is not None and assumed_ttl < 0:
            raise ValueError(f"assumed_ttl must be >= 0: {assumed_ttl}")
        self._ttl = assumed_ttl
        self._pods: dict[PodKey, PodRecord] = {}
        self._counts: dict[PodState, int] = dict.fromkeys(PodState, 0)
        """Kept on every transition: the gauges read it several times a second, and a scan of
        30 000 pods each time would cost more than the events."""
        self._deadlines: dict[PodKey, float] = {}
        """BOUND pods with a deadline, in deadline order: the TTL is one constant and ``now``
        only grows, so insertion order is deadline order and expiry stops at the first
        pod not yet due instead of scanning every pod."""

    def state(self, key: PodKey) -> PodState:
        record = self._pods.get(key)
        return PodState.INITIAL if record is None else record.state

    def record(self, key: PodKey) -> PodRecord | None:
        return self._pods.get(key)

    def keys_in(self, state: PodState) -> Iterator[PodKey]:
        return (k for k, r in self._pods.items() if r.state is state)

    def items(self) -> Iterator[tuple[PodKey, PodRecord]]:
        return iter(self._pods.items())

    def __iter__(self) -> Iterator[PodKey]:
        return iter(self._pods)

    def counts(self) -> dict[PodState, int]:
        """Pods per cached state (for the cache-size gauges); INITIAL is always 0."""
        return dict(self._counts)

    def __len__(self) -> int:
        return len(self._pods)

    def __contains__(self, key: object) -> bool:
        return key in self._pods

    def apply(
        self, key: PodKey, event: PodEvent, *, node: str | None = None, now: float | None = None
    ) -> Transition:
        """Apply one event by the table; raises IllegalTransitionError and changes nothing
        if the table forbids it. ``node`` is required by assume/add/update, ``now`` by
        finish_binding (to start the TTL)."""
        if event in _NEEDS_NODE and not node:
            raise ValueError(f"{event.value} needs the node")
        if event is PodEvent.FINISH_BINDING and now is None:
            raise ValueError("finish_binding needs now")
        current = self._pods.get(key)
        before = PodState.INITIAL if current is None else current.state
        rule = TRANSITIONS.get((before, event))
        if rule is None:
            raise IllegalTransitionError(key, before, event)
        known = None if current is None else current.node
        if event is PodEvent.UPDATE and known != node:
            raise NodeMismatchError(key, before, event, str(known), str(node))
        self._counts[before] -= before is not PodState.INITIAL
        self._counts[rule.target] += rule.target is not PodState.INITIAL
        self._deadlines.pop(key, None)
        if rule.target is PodState.INITIAL:
            self._pods.pop(key, None)
            node_after = None
        else:
            # The watch is the truth: an add may name another node than we assumed.
            node_after = node if event in _NEEDS_NODE else known
            assert node_after is not None
            deadline = None
            if rule.target is PodState.BOUND and self._ttl is not None:
                assert now is not None
                deadline = now + self._ttl
                self._deadlines[key] = deadline
            self._pods[key] = PodRecord(rule.target, node_after, deadline)
        return Transition(key, event, before, rule.target, known, node_after)

    def assume(self, key: PodKey, node: str) -> Transition:
        return self.apply(key, PodEvent.ASSUME, node=node)

    def finish_binding(self, key: PodKey, now: float) -> Transition:
        return self.apply(key, PodEvent.FINISH_BINDING, now=now)

    def forget(self, key: PodKey) -> Transition:
        return self.apply(key, PodEvent.FORGET)

    def expire(self, key: PodKey) -> Transition:
        return self.apply(key, PodEvent.EXPIRE)

    def add(self, key: PodKey, node: str) -> Transition:
        return self.apply(key, PodEvent.ADD, node=node)

    def update(self, key: PodKey, node: str) -> Transition:
        return self.apply(key, PodEvent.UPDATE, node=node)

    def remove(self, key: PodKey) -> Transition:
        return self.apply(key, PodEvent.REMOVE)

    def expire_due(self, now: float) -> list[Transition]:
        """Expire every BOUND pod whose deadline has passed (the cache calls this
        periodically)."""
        due = []
        for key, deadline in self._deadlines.items():
            if deadline >= now:
                break
            due.append(key)
        return [self.expire(key) for key in due]


def format_table() -> str:
    """The transition table as Markdown, every (state, event) pair, illegal ones included."""
    lines = ["| state | event | next | why |", "|---|---|---|---|"]
    for state in PodState:
        for event in PodEvent:
            rule = TRANSITIONS.get((state, event))
            target, why = ("(illegal)", "") if rule is None else (rule.target.value, rule.why)
            lines.append(f"| {state.value} | {event.value} | {target} | {why} |")
    return "\n".join(lines)

"""Gangs in the scheduler process: who belongs to which PodGroup, and what the queue holds.

Theory of operation (pure bookkeeping, no I/O; the scheduler calls it from watch handlers
and cycles on the one event loop):

* A pending pod of ours with the ``scheduling.x-k8s.io/pod-group`` label is a *member* of
  the gang ``namespace/<label>``. Placed members (assumed or bound, by anyone) are counted
  separately from pending ones; the cache says which placed keys are still there.
* ``need = minMember - placed``. While ``need > 0`` the queue holds ONE entry for the gang
  (:class:`GangEntry`), never its members: the gang is popped, solved and committed as a
  unit. Once ``need <= 0`` the gang is *admitted* and its remaining pending members are
  queued as ordinary pods.
* The entry is *gated* (the queue's gated place: never popped, never moved by events) while
  the PodGroup is missing or unreadable, or fewer than ``need`` ungated members are present
  (quorum). An update that lifts the gate moves it like any gated pod.
* The entry's ``revision`` changes with everything a solve reads (spec, members), so the
  queue's relevant-update rule retries an unschedulable gang when, and only when, it
  changed. Its ``priority`` is its members' highest; a *partial* gang (some members bound,
  ``need > 0``, e.g. after a failed binding or a restart) ranks ahead of every pod, so it
  has first claim on capacity that frees up, for a bounded time: its
  ``scheduleTimeoutSeconds`` (else ``spec.gang.partialBoostSeconds``) from the moment it
  first had members placed but short of ``minMember``, and never after it timed out.
  Without the bound a gang that cannot be completed would jump the queue forever.

The table of a gang's states, in one place::

    state        condition                                      queue holds
    missing      no (readable) PodGroup                         entry, gated
    waiting      PodGroup, fewer than need ungated members      entry, gated
    ready        PodGroup, quorum, need > 0                     entry (active/backoff/...)
    admitted     need <= 0                                      members, one by one
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from scheduler.control.queue import PodKey, pod_key
from scheduler.model.gang import POD_GROUP_LABEL, GangSpec, gang_key
from scheduler.model.pod import Pod
from scheduler.model.workload import UPSTREAM_PREFIX, pod_group_name

GANG_NAME_PREFIX: Final = "podgroup:"
"""Queue names of gang entries: ':' cannot occur in a pod name, so keys never collide."""
QUORUM_GATE: Final = "lattice.dev/gang-quorum"
MISSING_GATE: Final = "lattice.dev/gang-podgroup"
PARTIAL_BOOST: Final = 1 << 40
"""Added to a partial gang's priority: ahead of any pod priority (int32)."""


class GangPhase(enum.StrEnum):
    MISSING = "missing"
    WAITING = "waiting"
    READY = "ready"
    ADMITTED = "admitted"


@dataclass(frozen=True, slots=True)
class GangEntry:
    """What the queue holds for a gang; satisfies the queue's ``QueueablePod``."""

    namespace: str
    name: str
    """``podgroup:<name>``."""
    uid: str
    priority: int
    scheduling_gates: tuple[str, ...]
    revision: int

    @property
    def gang(self) -> str:
        return gang_key(self.namespace, self.name.removeprefix(GANG_NAME_PREFIX))


def gang_of(body: Mapping[str, Any]) -> str | None:
    """The gang key a pod body names, or None: scheduler-plugins' label, else the upstream
    ``spec.schedulingGroup.podGroupName`` (:mod:`scheduler.model.workload`)."""
    meta = body.get("metadata") or {}
    namespace = str(meta.get("namespace", ""))
    name = (meta.get("labels") or {}).get(POD_GROUP_LABEL)
    if name:
        return gang_key(namespace, name)
    upstream = pod_group_name(body.get("spec") or {})
    return gang_key(namespace, UPSTREAM_PREFIX + upstream) if upstream else None


def entry_key(gang: str) -> PodKey:
    namespace, name = gang.split("/", 1)
    return pod_key(namespace, GANG_NAME_PREFIX + name)


@dataclass
class Gang:
    key: str
    spec: GangSpec | None = None
    spec_error: str | None = None
    """Why the PodGroup did not parse (None: parsed, or absent)."""
    pending: dict[PodKey, Any] = field(default_factory=dict)
    """Pending members in arrival order: a Pod, or the scheduler's BrokenPod."""
    placed: set[PodKey] = field(default_factory=set)
    """Members assumed or bound (by anyone); the caller drops keys the cache lost."""
    running: set[PodKey] = field(default_factory=set)
    revision: int = 0
    quorum_at: float | None = None
    """Monotonic time quorum was first reached in this process (time-to-admit metric)."""
    started_wall: float | None = None
    """Unix time this process first saw quorum: the scheduleStartTime it writes when the
    PodGroup has none yet."""
    reported: dict[PodKey, str] = field(default_factory=dict)
    """The last waiting message each member got, so events are not repeated."""
    last_reason: str = ""
    last_message: str = ""
    partial_reported: bool = False
    timed_out: bool = False
    short_since: float | None = None
    """Monotonic time the gang last began to have members placed but fewer than minMember
    (None: it has none placed, or enough): the partial boost is measured from it."""
    boost_ended: bool = False
    """The partial boost ran out (reset when the gang is no longer short)."""

    @property
    def namespace(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.key.split("/", 1)[1]

    @property
    def min_member(self) -> int:
        return self.spec.min_member if self.spec is not None else 1

    @property
    def need(self) -> int:
        return self.min_member - len(self.placed)

    def ready_members(self) -> list[Pod]:
        """Pending members that can be placed now: parsed and without scheduling gates."""
        return [p for p in self.pending.values() if isinstance(p, Pod) and not p.scheduling_gates]

    def present(self) -> int:
        """Members counted for quorum: pending without gates (parsed or not)."""
        return sum(1 for p in self.pending.values() if not getattr(p, "scheduling_gates", ()))

    @property
    def phase(self) -> GangPhase:
        if self.spec is None:
            return GangPhase.MISSING
        if self.need <= 0:
            return GangPhase.ADMITTED
        if self.present() < self.need:
            return GangPhase.WAITING
        return GangPhase.READY

    @property
    def partial(self) -> bool:
        """Some members placed, fewer than minMember, and others waiting to join them. A
        gang whose members are finishing (or being deleted) with nobody pending is not."""
        return bool(self.placed) and bool(self.pending) and self.need > 0

    @property
    def short(self) -> bool:
        """Members placed, fewer than minMember: what the partial boost's clock measures."""
        return bool(self.placed) and self.need > 0

    @property
    def boosted(self) -> bool:
        """Ranked ahead of every pod: partial, and its boost neither timed out nor ran out."""
        return self.partial and not self.timed_out and not self.boost_ended

    def entry(self) -> GangEntry:
        priority = max((int(getattr(p, "priority", 0)) for p in self.pending.values()), default=0)
        if self.boosted:
            priority += PARTIAL_BOOST
        phase = self.phase
        gates: tuple[str, ...] = ()
        if phase is GangPhase.MISSING:
            gates = (MISSING_GATE,)
        elif phase is GangPhase.WAITING:
            gates = (QUORUM_GATE,)
        return GangEntry(
            namespace=self.namespace,
            name=GANG_NAME_PREFIX + self.name,
            uid=self.key,  # stable: a PodGroup created after its pods is the same gang
            priority=priority,
            scheduling_gates=gates,
            revision=self.revision,
        )

    def waiting_message(self) -> str:
        """Why the gang is not being placed, for the members' FailedScheduling events."""
        if self.spec is None:
            if self.spec_error:
                return f"gang {self.key}: PodGroup is invalid: {self.spec_error}"
            return (
                f"gang {self.key}: waiting for PodGroup {self.key} "
                "(scheduling.x-k8s.io/v1alpha1) to exist"
            )
        return (
            f"gang {self.key}: waiting for quorum: {self.present() + len(self.placed)}"
            f"/{self.min_member} members present"
        )


class GangBook:
    """Every gang the scheduler knows, by key; created by a member or a PodGroup."""

    def __init__(self) -> None:
        self._gangs: dict[str, Gang] = {}

    def __iter__(self) -> Iterator[Gang]:
        return iter(list(self._gangs.values()))

    def __len__(self) -> int:
        return len(self._gangs)

    def get(self, key: str) -> Gang | None:
        return self._gangs.get(key)

    def obtain(self, key: str) -> Gang:
        gang = self._gangs.get(key)
        if gang is None:
            gang = self._gangs[key] = Gang(key)
        return gang

    def discard_if_idle(self, key: str) -> None:
        """Forget a gang nothing refers to any more (no PodGroup, no members)."""
        gang = self._gangs.get(key)
        if gang is not None and gang.spec is None and not gang.pending and not gang.placed:
            del self._gangs[key]

    def partial_count(self) -> int:
        return sum(1 for g in self._gangs.values() if g.partial)

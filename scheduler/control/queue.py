"""The scheduling queue: which pending pod the scheduler tries next, and when it retries.

Modelled on kube-scheduler's PriorityQueue (``pkg/scheduler/backend/queue``), rewritten for one
asyncio event loop and without I/O: the watch handlers call :meth:`SchedulingQueue.add`,
``update``, ``delete`` and ``move_all_on_event``; the scheduling loop awaits ``pop`` and reports
each attempt back with ``done`` or ``requeue_after_failure``; a periodic task calls ``flush``.
Time comes from an injectable :class:`Clock`, so every rule below is testable with a fake one.

Theory of operation
-------------------
A tracked pod is in exactly one place at any time; nothing is ever dropped except by
``delete`` (the pod is gone) or ``done`` (the attempt placed it):

* **active**: a heap, higher ``priority`` first, then earlier enqueue time, then FIFO.
  ``pop`` takes its head and is the only way out to *in-flight*.
* **backoff**: pods that failed recently, ordered by backoff expiry. The backoff is
  ``initial * 2**(attempts-1)`` capped at ``max`` (1 s, 2 s, 4 s, 8 s, 10 s, 10 s ...), counted
  from the failure. ``flush`` moves expired ones to active; while active is empty, ``pop``
  takes the head of backoff at once (kube's ``SchedulerPopFromBackoffQ``, on by default),
  pods that failed with an error excepted.
* **unschedulable**: pods no node could take. Only a cluster change can help them, so they
  wait for ``move_all_on_event`` (or for ``max_unschedulable_stay``, 5 min, as a safety net
  against a missed event) and then go to backoff if their backoff has not expired yet,
  otherwise straight to active: an event never lets a pod skip its backoff.
* **gated**: pods with ``spec.schedulingGates``, and pods whose ResourceClaimTemplate claims
  kube-controller-manager has not named in ``status.resourceClaimStatuses`` yet (kube's
  DynamicResources PreEnqueue: no attempt, no FailedScheduling, until it writes them);
  never popped, never moved by events, released only by an ``update`` that removes the last
  gate or names the claims.
* **in-flight**: popped and being scheduled or bound. The attempt ends with ``done`` (the pod
  leaves the queue) or ``requeue_after_failure``.

The moves, in one place::

    from            operation                          to
    (new)           add / update of an unknown pod     active, or gated if it has gates
    active          pop                                in-flight
    backoff         pop while active is empty          in-flight (not after an error)
    in-flight       done                               (leaves the queue)
    in-flight       requeue, error                     backoff (active if backoff is 0)
    in-flight       requeue, unschedulable             unschedulable, but backoff/active if a
                                                       cluster event or a relevant update of
                                                       the pod arrived while it was in flight,
                                                       or the failure was a race
    backoff         flush, backoff expired             active
    unschedulable   move_all_on_event, relevant        backoff while backing off, else active
    unschedulable   flush, stayed > max stay           backoff while backing off, else active
    unschedulable   update that could matter           backoff while backing off, else active
    gated           update removing the last gate      backoff while backing off, else active
    any but gated   update adding gates                gated
    any             delete                             (leaves the queue)

Events that arrive while a pod is in flight are not lost (kube-scheduler's moveRequestCycle):
each ``pop`` starts a new scheduling cycle, and a relevant event records the current cycle as
the last move request. A pod that fails as unschedulable in a cycle no later than that request
may have missed the event that would have freed it, so it goes to backoff instead of waiting in
unschedulable. This is deliberately conservative: a spurious retry costs one cycle, a missed
event costs up to five minutes.

Pods are identified by :data:`PodKey` (``namespace/name``); the uid tells a recreated pod (same
name, new uid) from an update: a recreation replaces the old pod as a new one, and events for
the old uid (``delete``, or ``done``/``requeue`` of its in-flight attempt) are ignored.

Not thread-safe: call everything from the event loop that awaits ``pop``.
"""

from __future__ import annotations

import asyncio
import enum
import heapq
import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final, Generic, NamedTuple, NewType, Protocol, TypeVar

from scheduler.model.pod import Pod

PodKey = NewType("PodKey", str)
"""``namespace/name``: how the queue and the cache name a pod across its updates."""


def pod_key(namespace: str, name: str) -> PodKey:
    return PodKey(f"{namespace}/{name}")


class Clock(Protocol):
    """Where the queue reads the time (seconds; only differences matter)."""

    def now(self) -> float: ...


class MonotonicClock:
    """The production clock: monotonic, so backoffs survive wall-clock jumps."""

    def now(self) -> float:
        return time.monotonic()


class QueueablePod(Protocol):
    """What the queue needs to know about a pod; the model's pod record satisfies it."""

    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def scheduling_gates(self) -> Sequence[str]: ...


P = TypeVar("P", bound=QueueablePod)
T = TypeVar("T")


class QueueName(enum.StrEnum):
    """Where a tracked pod is. The values are the ``queue`` label of the pending-pods gauge."""

    ACTIVE = "active"
    BACKOFF = "backoff"
    UNSCHEDULABLE = "unschedulable"
    GATED = "gated"
    IN_FLIGHT = "in_flight"


PENDING_QUEUES: Final = (
    QueueName.ACTIVE,
    QueueName.BACKOFF,
    QueueName.UNSCHEDULABLE,
    QueueName.GATED,
)
"""The sub-queues of pods waiting for a scheduling attempt (in-flight ones are not waiting)."""


class ClusterEventType(enum.StrEnum):
    """Cluster changes that can make an unschedulable pod schedulable."""

    NODE_ADDED = "NodeAdded"
    NODE_CHANGED = "NodeChanged"
    """Only relevant with a non-empty :class:`NodeChange`."""
    NODE_TOPOLOGY_CHANGED = "NodeTopologyChanged"
    NODE_LOAD_DECREASED = "NodeLoadDecreased"
    """A node's measured load fell (or it reported again): only sent while a load filter
    is configured, since only that filter rejects pods for load."""
    POD_BOUND = "AssignedPodAdded"
    """A pod was bound (by anyone): affinity and spread constraints may now be satisfiable."""
    POD_CHANGED = "AssignedPodChanged"
    """A bound pod changed labels or shrank its requests; the caller filters other changes."""
    POD_DELETED = "AssignedPodDeleted"
    """A bound pod went away and freed its resources."""
    STORAGE_CHANGED = "StorageChanged"
    """A PersistentVolume, claim, StorageClass, CSINode, VolumeAttachment, CSIDriver or
    CSIStorageCapacity changed: only pods with claims can be concerned."""
    DRA_CHANGED = "ResourceClaimOrSliceChanged"
    """A DeviceClass, ResourceClaim or ResourceSlice changed: only pods with resource
    claims can be concerned (kube registers DynamicResources for these)."""
    QUOTA_CHANGED = "ElasticQuotaChanged"
    """An ElasticQuota was added, changed or deleted: its namespace's pods, and those of
    every other quota namespace (the sum of mins moved), may be admitted now."""
    PROFILE_CHANGED = "ProfileChanged"
    """The LatticeScheduler spec changed the profile: any verdict may differ (kube-scheduler
    gets a new configuration only by a restart, which retries every pod)."""


class NodeChange(enum.Flag):
    """What changed in a node update; other changes (heartbeats, conditions) never help."""

    NONE = 0
    ALLOCATABLE = enum.auto()
    LABELS = enum.auto()
    TAINTS = enum.auto()
    SCHEDULABLE = enum.auto()
    """``spec.unschedulable`` flipped (cordon/uncordon)."""
    DECLARED_FEATURES = enum.auto()
    """``status.declaredFeatures`` changed: only pods needing a feature can gain (kube's
    UpdateNodeDeclaredFeature, queued by NodeDeclaredFeatures' hint alone)."""


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    type: ClusterEventType
    node_changes: NodeChange = NodeChange.NONE
    subject: str = ""
    """The changed object's name, for logs only."""

    def __post_init__(self) -> None:
        if self.node_changes and self.type is not ClusterEventType.NODE_CHANGED:
            raise ValueError(f"node_changes only apply to {ClusterEventType.NODE_CHANGED}")

    @property
    def of_interest(self) -> bool:
        """False for an event that cannot help any pod, so it does not count as a move."""
        return self.type is not ClusterEventType.NODE_CHANGED or bool(self.node_changes)


@dataclass(frozen=True, kw_only=True, slots=True)
class QueueConfig:
    initial_backoff: float = 1.0
    """Seconds of backoff after the first failed attempt; doubles per further attempt."""
    max_backoff: float = 10.0
    """Cap of the backoff; 0 disables backoff entirely."""
    pop_from_backoff: bool = True
    """kube-scheduler's ``SchedulerPopFromBackoffQ`` (beta, on since 1.33): while active is
    empty, ``pop`` takes the head of backoff (earliest expiry first) instead of idling; a
    pod backing off after an error (not unschedulable) still waits its backoff out.
    Backoff spreads the retries of pods that compete; with nothing else to try it only
    delays, e.g. a preemptor whose victims are gone while the room it holds stays idle."""
    max_unschedulable_stay: float = 300.0
    """Seconds after which an unschedulable pod is retried even without a cluster event.
    Backoff and stay both end *at* their deadline: ``flush(deadline)`` moves the pod."""

    def __post_init__(self) -> None:
        if not 0 <= self.initial_backoff <= self.max_backoff:
            raise ValueError(
                f"need 0 <= initial_backoff ({self.initial_backoff}) "
                f"<= max_backoff ({self.max_backoff})"
            )
        if not self.max_unschedulable_stay > 0:
            raise ValueError(f"max_unschedulable_stay must be > 0: {self.max_unschedulable_stay}")


def backoff_duration(attempts: int, config: QueueConfig) -> float:
    """Backoff after ``attempts`` failed attempts: none before the first, then exponential."""
    if attempts <= 0:
        return 0.0
    # Capping the exponent keeps the float finite for absurd attempt counts.
    return min(config.max_backoff, config.initial_backoff * 2.0 ** min(attempts - 1, 64))


@dataclass(frozen=True, slots=True)
class QueuedPodInfo(Generic[P]):
    """A snapshot of a tracked pod; ``pop`` returns one as the handle of the attempt."""

    pod: P
    attempts: int
    """Attempts so far, including the one this handle stands for when popped."""
    cycle: int
    """Scheduling cycle of the latest attempt (0: never popped)."""
    first_queued_at: float | None
    """When the pod first became poppable (gated time excluded): the e2e latency start."""
    enqueued_at: float
    """When the pod was last (re)queued; orders equal priorities and times the unschedulable
    stay."""
    last_failure: str
    """Reason of the latest failed attempt, "" if none."""

    @property
    def key(self) -> PodKey:
        return pod_key(self.pod.namespace, self.pod.name)


class FlushResult(NamedTuple):
    backoff_completed: int
    unschedulable_timed_out: int


@dataclass(slots=True)
class _Entry(Generic[P]):
    pod: P
    key: PodKey
    enqueued_at: float
    first_queued_at: float | None = None
    attempts: int = 0
    cycle: int = 0
    backoff_until: float = -math.inf
    last_failure: str = ""
    updated_in_flight: bool = False
    error: bool = False
    """The last attempt ended in an error, not as unschedulable: its backoff is waited out
    in full (kube keeps such pods apart, in its error backoff queue)."""

    def info(self) -> QueuedPodInfo[P]:
        return QueuedPodInfo(
            pod=self.pod,
            attempts=self.attempts,
            cycle=self.cycle,
            first_queued_at=self.first_queued_at,
            enqueued_at=self.enqueued_at,
            last_failure=self.last_failure,
        )


@dataclass(order=True, slots=True)
class _Cell(Generic[T]):
    rank: tuple[float, ...]
    seq: int
    key: PodKey = field(compare=False)
    item: T = field(compare=False)
    alive: bool = field(default=True, compare=False)


class _IndexedHeap(Generic[T]):
    """A heap with removal by key: removed cells are marked dead and skipped (lazy deletion)."""

    def __init__(self, seq: Iterator[int] | None = None) -> None:
        self._heap: list[_Cell[T]] = []
        self._index: dict[PodKey, _Cell[T]] = {}
        self._seq = seq if seq is not None else itertools.count()

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def get(self, key: PodKey) -> T | None:
        cell = self._index.get(key)
        return None if cell is None else cell.item

    def push(self, key: PodKey, rank: tuple[float, ...], item: T) -> None:
        assert key not in self._index, f"{key} pushed twice"
        cell = _Cell(rank, next(self._seq), key, item)
        self._index[key] = cell
        heapq.heappush(self._heap, cell)

    def discard(self, key: PodKey) -> T | None:
        cell = self._index.pop(key, None)
        if cell is None:
            return None
        cell.alive = False
        # Dead cells cost memory and pop time; rebuild once they outnumber the live ones.
        if len(self._heap) > 64 and len(self._heap) > 2 * len(self._index):
            self._heap = [c for c in self._heap if c.alive]
            heapq.heapify(self._heap)
        return cell.item

    def peek(self) -> _Cell[T] | None:
        while self._heap and not self._heap[0].alive:
            heapq.heappop(self._heap)
        return self._heap[0] if self._heap else None

    def pop_head(self) -> T | None:
        head = self.peek()
        if head is None:
            return None
        heapq.heappop(self._heap)
        del self._index[head.key]
        head.alive = False
        return head.item

    def ordered(self) -> list[T]:
        return [c.item for c in sorted(self._index.values())]

    def cells(self) -> list[_Cell[T]]:
        return list(self._index.values())


TenantRank = Callable[[str], Fraction]
"""A namespace's place among tenants, lower first (see :meth:`SchedulingQueue.set_tenant_rank`)."""


class _TenantHeap(Generic[T]):
    """The active queue: one :class:`_IndexedHeap` per namespace, ranks ``(-priority,
    enqueued_at)``. Without a tenant rank the head is the least (rank, push order) of all,
    exactly a single heap's; with one, among the namespaces whose head has the highest
    priority the one the tenant rank puts first wins (ties: the single heap's order). Pops
    cost one look per namespace with pending pods."""

    def __init__(self) -> None:
        self._seq = itertools.count()
        self._by_ns: dict[str, _IndexedHeap[T]] = {}
        self._ns_of: dict[PodKey, str] = {}
        self.rank: TenantRank | None = None

    def __len__(self) -> int:
        return len(self._ns_of)

    def __contains__(self, key: object) -> bool:
        return key in self._ns_of

    def get(self, key: PodKey) -> T | None:
        ns = self._ns_of.get(key)
        return None if ns is None else self._by_ns[ns].get(key)

    def push(self, key: PodKey, rank: tuple[float, ...], item: T) -> None:
        ns = key.split("/", 1)[0]
        heap = self._by_ns.get(ns)
        if heap is None:
            heap = self._by_ns[ns] = _IndexedHeap(self._seq)
        heap.push(key, rank, item)
        self._ns_of[key] = ns

    def discard(self, key: PodKey) -> T | None:
        ns = self._ns_of.pop(key, None)
        if ns is None:
            return None
        heap = self._by_ns[ns]
        item = heap.discard(key)
        if not heap:
            del self._by_ns[ns]
        return item

    def _order(self, ns: str, cell: _Cell[T]) -> tuple[Any, ...]:
        if self.rank is None:
            return (cell.rank, cell.seq)
        return (cell.rank[0], self.rank(ns), cell.rank[1:], cell.seq)

    def pop_head(self) -> T | None:
        best: tuple[tuple[Any, ...], str, PodKey] | None = None
        for ns, heap in self._by_ns.items():
            head = heap.peek()
            assert head is not None  # empty sub-heaps are dropped
            order = self._order(ns, head)
            if best is None or order < best[0]:
                best = (order, ns, head.key)
        if best is None:
            return None
        _, ns, key = best
        heap = self._by_ns[ns]
        item = heap.pop_head()
        if not heap:
            del self._by_ns[ns]
        del self._ns_of[key]
        return item

    def ordered(self) -> list[T]:
        cells = [(ns, c) for ns, heap in self._by_ns.items() for c in heap.cells()]
        return [c.item for _, c in sorted(cells, key=lambda nc: self._order(*nc))]


def _differs(old: object, new: object) -> bool:
    return old != new


class SchedulingQueue(Generic[P]):
    """Pending pods of one scheduler, in five disjoint places (see the module docstring)."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        config: QueueConfig | None = None,
        is_relevant_update: Callable[[P, P], bool] = _differs,
        pops_early: Callable[[P], bool] = lambda _: True,
    ) -> None:
        """``is_relevant_update(old, new)`` says whether an update could change the pod's
        scheduling outcome; the default (any difference) suits a record holding only
        scheduling inputs, as kube-scheduler ignores status-only changes. ``pops_early``:
        whether a pod backing off may be popped before its backoff ends
        (:attr:`QueueConfig.pop_from_backoff`)."""
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._config = config if config is not None else QueueConfig()
        self._is_relevant_update = is_relevant_update
        self._pops_early = pops_early
        self._active: _TenantHeap[_Entry[P]] = _TenantHeap()
        self._backoff: _IndexedHeap[_Entry[P]] = _IndexedHeap()
        # Insertion order is enqueue order (only requeue_after_failure inserts, with now),
        # which lets flush stop at the first pod that has not overstayed.
        self._unschedulable: dict[PodKey, _Entry[P]] = {}
        self._gated: dict[PodKey, _Entry[P]] = {}
        self._in_flight: dict[PodKey, _Entry[P]] = {}
        self._cycle = 0
        self._move_request_cycle = -1
        self._closed = False
        self._wake = asyncio.Event()
        self._active_since = -math.inf
        """When active last went from empty to non-empty."""
        self._last_pop = -math.inf

    # -- introspection -------------------------------------------------------------------

    @property
    def config(self) -> QueueConfig:
        return self._config

    @property
    def scheduling_cycle(self) -> int:
        """Number of pops so far; the cycle number of the latest attempt."""
        return self._cycle

    @property
    def closed(self) -> bool:
        return self._closed

    def set_tenant_rank(self, rank: TenantRank | None) -> None:
        """Order pods of equal priority by their namespace's rank, lower first, before
        enqueue time (the fair-share policy: the tenant furthest below its fair share
        first); None restores kube's order. Priority always comes first. ``rank`` is called
        once per namespace with pending pods at every pop: it must be cheap (a lookup in
        ranks the caller recomputes when usage or demand changes)."""
        self._active.rank = rank

    def where(self, key: PodKey) -> QueueName | None:
        found = self._find(key)
        return None if found is None else found[0]

    def get(self, key: PodKey) -> QueuedPodInfo[P] | None:
        found = self._find(key)
        return None if found is None else found[1].info()

    def count(self, queue: QueueName) -> int:
        return len(self._container(queue))

    def counts(self) -> dict[QueueName, int]:
        return {q: self.count(q) for q in QueueName}

    def pods(self, queue: QueueName) -> list[P]:
        """The pods in one place; active in pop order, backoff in expiry order."""
        container = self._container(queue)
        entries = (
            container.ordered()
            if isinstance(container, _IndexedHeap | _TenantHeap)
            else container.values()
        )
        return [e.pod for e in entries]

    def __len__(self) -> int:
        """All tracked pods, in-flight ones included."""
        return sum(self.counts().values())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._find(PodKey(key)) is not None

    def starved_for(self, *, since: float = -math.inf) -> float:
        """Seconds that poppable pods have waited with no pop at all, counted from no earlier
        than ``since`` (when the caller started popping): how a stalled scheduling loop
        shows. 0 while active is empty or the queue is closed, so an idle queue is fine."""
        if self._closed or not self._active:
            return 0.0
        start = max(self._active_since, self._last_pop, since)
        return max(0.0, self._clock.now() - start)

    def next_flush_at(self) -> float | None:
        """When ``flush`` will next have something to move, so the caller can sleep until."""
        times = []
        if (head := self._backoff.peek()) is not None:
            times.append(head.item.backoff_until)
        if (oldest := next(iter(self._unschedulable.values()), None)) is not None:
            times.append(oldest.enqueued_at + self._config.max_unschedulable_stay)
        return min(times, default=None)

    # -- the watch side ------------------------------------------------------------------

    def add(self, pod: P) -> QueueName:
        """A pending pod appeared. A known key with the same uid is an update."""
        key = pod_key(pod.namespace, pod.name)
        found = self._find(key)
        if found is not None:
            if found[1].pod.uid == pod.uid:
                return self.update(pod)
            self._take(key)
        now = self._clock.now()
        return self._requeue(_Entry(pod=pod, key=key, enqueued_at=now), now)

    def update(self, pod: P) -> QueueName:
        """A pending pod changed; an unknown pod (or a new uid) is added as new."""
        key = pod_key(pod.namespace, pod.name)
        found = self._find(key)
        if found is None or found[1].pod.uid != pod.uid:
            return self.add(pod)
        where, entry = found
        old, entry.pod = entry.pod, pod
        relevant = self._is_relevant_update(old, pod)
        now = self._clock.now()
        match where:
            case QueueName.IN_FLIGHT:
                # Applied when the attempt ends; a relevant change means a failed attempt
                # may succeed now, like an event during the cycle.
                entry.updated_in_flight = entry.updated_in_flight or relevant
                return where
            case QueueName.ACTIVE | QueueName.BACKOFF:
                # Re-push: priority may have changed, or gates appeared.
                self._take(key)
                if _is_gated(pod):
                    return self._to_gated(entry)
                if where is QueueName.ACTIVE:
                    return self._to_active(entry, now)
                return self._to_backoff(entry)
            case QueueName.UNSCHEDULABLE:
                if not relevant and not _is_gated(pod):
                    return where
                del self._unschedulable[key]
                return self._requeue(entry, now)
            case QueueName.GATED:
                if _is_gated(pod):
                    return where
                del self._gated[key]
                return self._requeue(entry, now)
        raise AssertionError(where)  # pragma: no cover

    def delete(self, pod: P) -> bool:
        """The pod is gone (or was bound); a stale uid is ignored. True if it was tracked."""
        key = pod_key(pod.namespace, pod.name)
        found = self._find(key)
        if found is None or found[1].pod.uid != pod.uid:
            return False
        self._take(key)
        return True

    def move_all_on_event(
        self, event: ClusterEvent, pre_check: Callable[[P], bool] | None = None
    ) -> int:
        """Retry the unschedulable pods this event may help; returns how many moved.

        ``pre_check`` narrows the move to pods the event can concern (affinity matching a
        newly bound pod, say). In-flight pods are conservatively counted as concerned.
        """
        if not event.of_interest:
            return 0
        self._move_request_cycle = self._cycle
        now = self._clock.now()
        moving = [
            key
            for key, entry in self._unschedulable.items()
            if pre_check is None or pre_check(entry.pod)
        ]
        for key in moving:
            self._requeue(self._unschedulable.pop(key), now)
        return len(moving)

    def flush(self, now: float | None = None) -> FlushResult:
        """Move pods whose backoff expired to active and overstaying unschedulable pods out."""
        now = self._clock.now() if now is None else now
        limit = now - self._config.max_unschedulable_stay
        timed_out = 0
        while self._unschedulable:
            key, entry = next(iter(self._unschedulable.items()))
            if entry.enqueued_at > limit:
                break
            del self._unschedulable[key]
            self._requeue(entry, now)
            timed_out += 1
        completed = 0
        while (head := self._backoff.peek()) is not None and head.item.backoff_until <= now:
            ready = self._backoff.pop_head()
            assert ready is not None
            self._to_active(ready, now)
            completed += 1
        return FlushResult(completed, timed_out)

    # -- the scheduling side -------------------------------------------------------------

    def try_pop(self) -> QueuedPodInfo[P] | None:
        """The head of active, now in flight; while active is empty, the head of backoff
        (:attr:`QueueConfig.pop_from_backoff`); None if both are empty or the queue closed."""
        if self._closed:
            return None
        entry = self._active.pop_head()
        if entry is None and self._config.pop_from_backoff:
            entry = self._pop_backoff_early()
        if entry is None:
            return None
        self._last_pop = self._clock.now()
        self._cycle += 1
        entry.cycle = self._cycle
        entry.attempts += 1
        entry.updated_in_flight = False
        self._in_flight[entry.key] = entry
        return entry.info()

    async def pop(self) -> QueuedPodInfo[P] | None:
        """Wait for an active pod; None once the queue is closed (shutdown)."""
        while not self._closed:
            info = self.try_pop()
            if info is not None:
                return info
            self._wake.clear()
            await self._wake.wait()
        return None

    def in_flight(self, attempt: QueuedPodInfo[P]) -> bool:
        """Whether ``attempt`` is still the pod's current attempt (not deleted, nor
        replaced by a pod of another uid, since it was popped)."""
        entry = self._in_flight.get(attempt.key)
        if entry is None:
            return False
        return entry.pod.uid == attempt.pod.uid and entry.cycle == attempt.cycle

    def done(self, attempt: QueuedPodInfo[P]) -> bool:
        """The attempt placed the pod: it leaves the queue. False for a stale handle."""
        return self._end_attempt(attempt) is not None

    def requeue_after_failure(
        self, attempt: QueuedPodInfo[P], *, unschedulable: bool, reason: str, race: bool = False
    ) -> QueueName | None:
        """The attempt failed; None if the pod was deleted or recreated meanwhile.

        ``unschedulable``: no node fits, so only a cluster change helps; otherwise an error
        (bind failure, API trouble) that a plain retry after backoff may fix. ``race``: an
        unschedulable outcome caused by a change that arrived during the attempt (a gang's
        plan overtaken at commit): the change already happened, so the pod retries after
        its backoff, as when it missed an event.
        """
        entry = self._end_attempt(attempt)
        if entry is None:
            return None
        now = self._clock.now()
        entry.enqueued_at = now
        entry.last_failure = reason
        entry.error = not unschedulable
        entry.backoff_until = now + backoff_duration(entry.attempts, self._config)
        missed_event = race or self._move_request_cycle >= entry.cycle or entry.updated_in_flight
        if unschedulable and not missed_event and not _is_gated(entry.pod):
            self._unschedulable[entry.key] = entry
            return QueueName.UNSCHEDULABLE
        return self._requeue(entry, now)

    def close(self) -> None:
        """Shutdown: waiting and future pops return None. Tracked pods stay for inspection."""
        self._closed = True
        self._wake.set()

    # -- internals -----------------------------------------------------------------------

    def _container(
        self, queue: QueueName
    ) -> _TenantHeap[_Entry[P]] | _IndexedHeap[_Entry[P]] | dict[PodKey, _Entry[P]]:
        match queue:
            case QueueName.ACTIVE:
                return self._active
            case QueueName.BACKOFF:
                return self._backoff
            case QueueName.UNSCHEDULABLE:
                return self._unschedulable
            case QueueName.GATED:
                return self._gated
            case QueueName.IN_FLIGHT:
                return self._in_flight
        raise AssertionError(queue)  # pragma: no cover

    def _find(self, key: PodKey) -> tuple[QueueName, _Entry[P]] | None:
        for name in QueueName:
            entry = self._container(name).get(key)
            if entry is not None:
                return name, entry
        return None

    def _take(self, key: PodKey) -> _Entry[P] | None:
        for heap in (self._active, self._backoff):
            if (entry := heap.discard(key)) is not None:
                return entry
        for table in (self._unschedulable, self._gated, self._in_flight):
            if (entry := table.pop(key, None)) is not None:
                return entry
        return None

    def _end_attempt(self, attempt: QueuedPodInfo[P]) -> _Entry[P] | None:
        entry = self._in_flight.get(attempt.key)
        if entry is None or entry.pod.uid != attempt.pod.uid or entry.cycle != attempt.cycle:
            return None
        del self._in_flight[attempt.key]
        return entry

    def _requeue(self, entry: _Entry[P], now: float) -> QueueName:
        """Back to waiting: gated if gated, backoff while backing off, else active."""
        if _is_gated(entry.pod):
            return self._to_gated(entry)
        if entry.backoff_until > now:
            return self._to_backoff(entry)
        return self._to_active(entry, now)

    def _to_active(self, entry: _Entry[P], now: float) -> QueueName:
        if not self._active:
            self._active_since = now
        if entry.first_queued_at is None:
            entry.first_queued_at = now
        self._active.push(entry.key, (-entry.pod.priority, entry.enqueued_at), entry)
        self._wake.set()
        return QueueName.ACTIVE

    def _to_backoff(self, entry: _Entry[P]) -> QueueName:
        self._backoff.push(entry.key, (entry.backoff_until, -entry.pod.priority), entry)
        if self._config.pop_from_backoff and not entry.error and self._pops_early(entry.pod):
            self._wake.set()  # poppable while active is empty
        return QueueName.BACKOFF

    def _pop_backoff_early(self) -> _Entry[P] | None:
        """The pod backing off after an unschedulable attempt whose backoff ends first
        (kube's ``popBackoff``); None if every pod backing off failed with an error."""
        cells = [
            c for c in self._backoff.cells() if not c.item.error and self._pops_early(c.item.pod)
        ]
        if not cells:
            return None
        return self._backoff.discard(min(cells).key)

    def _to_gated(self, entry: _Entry[P]) -> QueueName:
        self._gated[entry.key] = entry
        return QueueName.GATED


def _is_gated(pod: QueueablePod) -> bool:
    return len(pod.scheduling_gates) > 0 or (isinstance(pod, Pod) and pod.claims_not_generated)

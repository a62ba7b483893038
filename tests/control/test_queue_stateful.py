"""No pod is ever lost or duplicated, whatever the order of watch events, attempts and time.

A hypothesis state machine drives the queue with random adds (new or recreated pods, gated or
not), updates, deletes (current and stale uids), pops, attempt outcomes (done, unschedulable,
error; current and stale handles), cluster events and clock jumps with flushes, and checks
after every step that each live pod is in exactly one place, holding its latest version.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from scheduler.control.queue import (
    ClusterEvent,
    ClusterEventType,
    NodeChange,
    PodKey,
    QueueConfig,
    QueuedPodInfo,
    QueueName,
    SchedulingQueue,
)
from tests.control.builders import FakeClock, FakePod

NAMES = ("a", "b", "c")
GATE = "example.com/gate"
EVENTS = (
    ClusterEvent(ClusterEventType.NODE_ADDED),
    ClusterEvent(ClusterEventType.NODE_CHANGED, NodeChange.ALLOCATABLE),
    ClusterEvent(ClusterEventType.NODE_CHANGED),  # of no interest
    ClusterEvent(ClusterEventType.POD_DELETED),
)
UPDATES = ("priority", "label", "gate", "ungate", "same", "recreate")


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.queue: SchedulingQueue[FakePod] = SchedulingQueue(clock=self.clock)
        self.live: dict[PodKey, FakePod] = {}
        """Pods added and neither deleted nor placed: what the queue must hold."""
        self.in_flight: dict[PodKey, int] = {}
        """Cycle of each live pod's current attempt."""
        self.handles: list[QueuedPodInfo[FakePod]] = []
        """Every popped attempt not yet reported, including ones gone stale."""
        self.reported: list[QueuedPodInfo[FakePod]] = []
        """Attempts already reported once."""

    @initialize(
        backoff=st.sampled_from([0.0, 1.0]),
        pop_from_backoff=st.booleans(),
        pods=st.lists(st.sampled_from(NAMES), min_size=1, max_size=len(NAMES), unique=True),
    )
    def start(self, backoff: float, pop_from_backoff: bool, pods: list[str]) -> None:
        """Some pods to begin with, so short runs already pop and fail; without backoff a
        failed pod is poppable again at once, for denser interleavings."""
        config = QueueConfig(
            initial_backoff=backoff, max_backoff=10 * backoff, pop_from_backoff=pop_from_backoff
        )
        self.queue = SchedulingQueue(clock=self.clock, config=config)
        for name in pods:
            self.add(name, priority=0, gated=False)

    def _pick(self, data: st.DataObject) -> FakePod:
        return self.live[data.draw(st.sampled_from(sorted(self.live)))]

    def _forget_attempt(self, key: PodKey) -> None:
        self.in_flight.pop(key, None)

    # -- watch side ---------------------------------------------------------------------

    @rule(name=st.sampled_from(NAMES), priority=st.integers(-2, 2), gated=st.booleans())
    def add(self, name: str, priority: int, gated: bool) -> None:
        pod = FakePod(name=name, priority=priority, scheduling_gates=(GATE,) if gated else ())
        where = self.queue.add(pod)  # a fresh uid: a recreation if the name is live
        assert where is (QueueName.GATED if gated else QueueName.ACTIVE)
        self._forget_attempt(pod.key)
        self.live[pod.key] = pod

    @precondition(lambda self: self.live)
    @rule(data=st.data(), change=st.sampled_from(UPDATES), priority=st.integers(-2, 2))
    def update(self, data: st.DataObject, change: str, priority: int) -> None:
        pod = self._pick(data)
        new = {
            "priority": pod.with_priority(priority),
            "label": pod.with_label("k", str(priority)),
            "gate": pod.with_gates(GATE),
            "ungate": pod.with_gates(),
            "same": replace(pod),
            "recreate": pod.recreated(),
        }[change]
        where = self.queue.update(new)
        if change == "recreate":
            self._forget_attempt(pod.key)
        elif pod.key in self.in_flight:
            assert where is QueueName.IN_FLIGHT
        self.live[pod.key] = new

    @precondition(lambda self: self.live)
    @rule(data=st.data(), stale=st.booleans())
    def delete(self, data: st.DataObject, stale: bool) -> None:
        pod = self._pick(data)
        if stale:
            assert not self.queue.delete(pod.recreated())
            return
        assert self.queue.delete(pod)
        del self.live[pod.key]
        self._forget_attempt(pod.key)

    @rule(event=st.sampled_from(EVENTS))
    def cluster_event(self, event: ClusterEvent) -> None:
        moved = self.queue.move_all_on_event(event)
        assert moved == 0 or event.of_interest

    @rule(seconds=st.sampled_from([0.0, 0.5, 1.0, 2.0, 10.0, 301.0]))
    def tick(self, seconds: float) -> None:
        now = self.clock.advance(seconds)
        self.queue.flush()
        next_at = self.queue.next_flush_at()
        assert next_at is None or next_at > now
        stay = self.queue.config.max_unschedulable_stay
        for pod in self.queue.pods(QueueName.UNSCHEDULABLE):
            info = self.queue.get(pod.key)
            assert info is not None
            assert info.enqueued_at + stay > now, "overstayed a flush"

    # -- scheduling side ----------------------------------------------------------------

    @rule()
    def pop(self) -> None:
        active = self.queue.pods(QueueName.ACTIVE)
        # With active empty, SchedulerPopFromBackoffQ takes the earliest backoff expiry.
        # (a pod that failed with an error waits its backoff out: reason "error" here).
        backing_off = [p for p in self.queue.pods(QueueName.BACKOFF) if self._failure(p) != "error"]
        poppable = active or (backing_off if self.queue.config.pop_from_backoff else [])
        info = self.queue.try_pop()
        if not poppable:
            assert info is None
            return
        assert info is not None
        assert info.pod == poppable[0]
        assert not info.pod.scheduling_gates
        if active:
            assert info.pod.priority == max(p.priority for p in active)
        assert info.cycle == self.queue.scheduling_cycle
        self.in_flight[info.key] = info.cycle
        self.handles.append(info)

    def _failure(self, pod: FakePod) -> str:
        info = self.queue.get(pod.key)
        assert info is not None
        return info.last_failure

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), outcome=st.sampled_from(["done", "unschedulable", "error"]))
    def finish(self, data: st.DataObject, outcome: str) -> None:
        info = self.handles.pop(data.draw(st.integers(0, len(self.handles) - 1)))
        current = self.in_flight.get(info.key) == info.cycle
        self._report(info, outcome, current=current)
        if current:
            del self.in_flight[info.key]
        self.reported.append(info)

    @precondition(lambda self: self.reported)
    @rule(data=st.data(), outcome=st.sampled_from(["done", "unschedulable", "error"]))
    def report_again(self, data: st.DataObject, outcome: str) -> None:
        """A second report of a finished attempt (a bug in the caller) must change nothing,
        even when the same pod is in flight again in a later cycle."""
        info = data.draw(st.sampled_from(self.reported))
        self._report(info, outcome, current=False)

    def _report(self, info: QueuedPodInfo[FakePod], outcome: str, *, current: bool) -> None:
        if outcome == "done":
            assert self.queue.done(info) is current
            if current:
                del self.live[info.key]
            return
        where = self.queue.requeue_after_failure(
            info, unschedulable=outcome == "unschedulable", reason=outcome
        )
        if not current:
            assert where is None
        else:
            assert where is not None
            assert where is not QueueName.IN_FLIGHT
            assert outcome == "unschedulable" or where is not QueueName.UNSCHEDULABLE

    # -- the property -------------------------------------------------------------------

    @invariant()
    def every_live_pod_is_in_exactly_one_place(self) -> None:
        places: dict[PodKey, list[QueueName]] = {}
        for queue in QueueName:
            pods = self.queue.pods(queue)
            assert len(pods) == self.queue.count(queue)
            for pod in pods:
                places.setdefault(pod.key, []).append(queue)
                assert self.live.get(pod.key) == pod, "stale or unknown version"
        assert set(places) == set(self.live), "lost or phantom pods"
        for key, where in places.items():
            assert len(where) == 1, f"{key} duplicated in {where}"
            if self.live[key].scheduling_gates:
                assert where[0] in (QueueName.GATED, QueueName.IN_FLIGHT)
            else:
                assert where[0] is not QueueName.GATED
        assert {k for k, w in places.items() if w == [QueueName.IN_FLIGHT]} == set(self.in_flight)
        assert len(self.queue) == len(self.live)


QueueMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=50, deadline=None, database=None
)
TestQueueNeverLosesPods = QueueMachine.TestCase

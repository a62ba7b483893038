"""The scheduling queue's rules, one table per rule (synchronous API; pop is in test_queue_pop)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from scheduler.control.queue import (
    PENDING_QUEUES,
    ClusterEvent,
    ClusterEventType,
    NodeChange,
    PodKey,
    QueueConfig,
    QueueName,
    SchedulingQueue,
    backoff_duration,
    pod_key,
)
from scheduler.obs.metrics import QUEUE_LABELS
from tests.control.builders import NODE_ADDED, FakeClock, FakePod, make_pod, make_queue, pop, put_in

# -- ordering -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arrivals", "expected"),
    [
        pytest.param([("a", 0, 0.0), ("b", 10, 1.0)], "ba", id="higher-priority-first"),
        pytest.param([("a", 5, 0.0), ("b", 5, 1.0), ("c", 5, 2.0)], "abc", id="fifo-same-prio"),
        pytest.param([("a", 1, 0.0), ("b", 1, 0.0), ("c", 1, 0.0)], "abc", id="ties-insertion"),
        pytest.param(
            [("a", 0, 0.0), ("b", 3, 1.0), ("c", 3, 2.0), ("d", 9, 3.0)], "dbca", id="mixed"
        ),
        pytest.param([("a", -5, 0.0), ("b", 0, 1.0)], "ba", id="negative-priority"),
        pytest.param([("a", 2**31 - 1, 1.0), ("b", -(2**31), 0.0)], "ab", id="extremes"),
    ],
)
def test_pop_order_is_priority_then_arrival(
    arrivals: list[tuple[str, int, float]], expected: str
) -> None:
    queue, clock = make_queue()
    start = clock.now()
    for name, priority, at in arrivals:
        clock.t = start + at
        queue.add(make_pod(name, priority=priority))
    assert [p.name for p in queue.pods(QueueName.ACTIVE)] == list(expected)
    assert "".join(pop(queue).pod.name for _ in expected) == expected
    assert queue.try_pop() is None


def test_priority_update_reorders_active() -> None:
    queue, _ = make_queue()
    a, b = make_pod("a", priority=1), make_pod("b", priority=2)
    queue.add(a)
    queue.add(b)
    assert queue.update(a.with_priority(3)) is QueueName.ACTIVE
    assert [pop(queue).pod.name for _ in range(2)] == ["a", "b"]


def test_requeued_pod_sorts_by_its_failure_time() -> None:
    queue, clock = make_queue()
    queue.add(make_pod("a"))
    queue.requeue_after_failure(pop(queue), unschedulable=False, reason="bind failed")
    clock.advance(0.5)
    queue.add(make_pod("b"))
    clock.advance(0.5)
    assert queue.flush() == (1, 0)
    assert [pop(queue).pod.name for _ in range(2)] == ["a", "b"]


# -- backoff ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempts", "config", "expected"),
    [
        pytest.param(0, QueueConfig(), 0.0, id="never-tried"),
        pytest.param(1, QueueConfig(), 1.0, id="1"),
        pytest.param(2, QueueConfig(), 2.0, id="2"),
        pytest.param(3, QueueConfig(), 4.0, id="4"),
        pytest.param(4, QueueConfig(), 8.0, id="8"),
        pytest.param(5, QueueConfig(), 10.0, id="capped-10"),
        pytest.param(6, QueueConfig(), 10.0, id="stays-capped"),
        pytest.param(10_000, QueueConfig(), 10.0, id="huge-count"),
        pytest.param(3, QueueConfig(initial_backoff=0.5, max_backoff=60), 2.0, id="custom"),
        pytest.param(3, QueueConfig(initial_backoff=0, max_backoff=0), 0.0, id="disabled"),
    ],
)
def test_backoff_duration(attempts: int, config: QueueConfig, expected: float) -> None:
    assert backoff_duration(attempts, config) == expected


def test_backoff_grows_per_failed_attempt_and_ends_at_its_deadline() -> None:
    queue, clock = make_queue()
    queue.add(make_pod("a"))
    for expected in [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]:
        attempt = pop(queue)
        assert queue.requeue_after_failure(attempt, unschedulable=False, reason="x") is (
            QueueName.BACKOFF
        )
        failed_at = clock.now()
        assert queue.next_flush_at() == failed_at + expected
        clock.t = failed_at + expected - 0.001
        assert queue.flush() == (0, 0)
        assert queue.where(attempt.key) is QueueName.BACKOFF
        clock.t = failed_at + expected
        assert queue.flush() == (1, 0)
        assert queue.where(attempt.key) is QueueName.ACTIVE
    assert pop(queue).attempts == 7


def test_backoff_queue_flushes_in_expiry_order() -> None:
    queue, clock = make_queue()
    for name in "ab":
        queue.add(make_pod(name))
    start = clock.now()
    queue.requeue_after_failure(pop(queue), unschedulable=False, reason="x")
    clock.advance(0.2)
    queue.requeue_after_failure(pop(queue), unschedulable=False, reason="x")
    assert [p.name for p in queue.pods(QueueName.BACKOFF)] == ["a", "b"]
    assert queue.flush(start + 1) == (1, 0)
    assert [p.name for p in queue.pods(QueueName.ACTIVE)] == ["a"]
    assert queue.flush(start + 1.2) == (1, 0)


def test_zero_backoff_requeues_straight_to_active() -> None:
    queue, _ = make_queue(initial_backoff=0, max_backoff=0)
    queue.add(make_pod("a"))
    assert queue.requeue_after_failure(pop(queue), unschedulable=False, reason="x") is (
        QueueName.ACTIVE
    )


@pytest.mark.parametrize(
    "config",
    [
        pytest.param({"initial_backoff": -1.0}, id="negative-initial"),
        pytest.param({"initial_backoff": 20.0}, id="initial-above-max"),
        pytest.param({"max_unschedulable_stay": 0.0}, id="zero-stay"),
    ],
)
def test_config_is_validated(config: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"must be|need"):
        QueueConfig(**config)


# -- gating -------------------------------------------------------------------------------

GATE = "example.com/quota"


def test_gated_pod_is_never_popped_until_its_gates_are_removed() -> None:
    queue, clock = make_queue()
    pod = make_pod("g", gates=(GATE, "other/gate"))
    assert queue.add(pod) is QueueName.GATED
    assert queue.try_pop() is None
    assert queue.move_all_on_event(NODE_ADDED) == 0
    clock.advance(3600)
    assert queue.flush() == (0, 0)
    assert queue.update(pod.with_gates(GATE)) is QueueName.GATED
    assert queue.update(pod.with_gates(GATE).with_label("x", "y")) is QueueName.GATED
    assert queue.try_pop() is None
    assert queue.update(pod.with_gates()) is QueueName.ACTIVE
    attempt = pop(queue)
    assert attempt.first_queued_at == clock.now(), "gated time is not scheduling latency"


@pytest.mark.parametrize(
    "where", [QueueName.ACTIVE, QueueName.BACKOFF, QueueName.UNSCHEDULABLE], ids=str
)
def test_update_adding_gates_moves_pod_to_gated(where: QueueName) -> None:
    # The API server forbids adding gates; the queue still never pops a gated pod.
    queue, clock = make_queue()
    pod, _ = put_in(queue, clock, where)
    assert queue.update(pod.with_gates(GATE)) is QueueName.GATED


def test_in_flight_pod_that_gained_gates_goes_back_to_gated() -> None:
    queue, clock = make_queue()
    pod, attempt = put_in(queue, clock, QueueName.IN_FLIGHT)
    assert attempt is not None
    queue.update(pod.with_gates(GATE))
    assert queue.requeue_after_failure(attempt, unschedulable=True, reason="x") is (QueueName.GATED)


def test_ungated_pod_that_is_still_backing_off_waits_in_backoff() -> None:
    queue, clock = make_queue()
    pod, attempt = put_in(queue, clock, QueueName.IN_FLIGHT)
    assert attempt is not None
    queue.update(pod.with_gates(GATE))
    queue.requeue_after_failure(attempt, unschedulable=False, reason="x")
    assert queue.update(pod) is QueueName.BACKOFF


# -- moves on cluster events --------------------------------------------------------------

ALL_EVENTS = [
    pytest.param(ClusterEvent(ClusterEventType.NODE_ADDED), id="node-added"),
    *(
        pytest.param(ClusterEvent(ClusterEventType.NODE_CHANGED, change), id=f"node-{change.name}")
        for change in NodeChange
        if change
    ),
    pytest.param(
        ClusterEvent(ClusterEventType.NODE_CHANGED, NodeChange.LABELS | NodeChange.TAINTS),
        id="node-labels+taints",
    ),
    pytest.param(ClusterEvent(ClusterEventType.NODE_TOPOLOGY_CHANGED), id="topology"),
    pytest.param(ClusterEvent(ClusterEventType.POD_BOUND), id="pod-bound"),
    pytest.param(ClusterEvent(ClusterEventType.POD_CHANGED), id="pod-changed"),
    pytest.param(ClusterEvent(ClusterEventType.POD_DELETED), id="pod-deleted"),
]


@pytest.mark.parametrize("event", ALL_EVENTS)
def test_relevant_event_moves_unschedulable_pod_to_backoff_while_backing_off(
    event: ClusterEvent,
) -> None:
    queue, clock = make_queue()
    pod, _ = put_in(queue, clock, QueueName.UNSCHEDULABLE)
    assert event.of_interest
    assert queue.move_all_on_event(event) == 1
    assert queue.where(pod.key) is QueueName.BACKOFF


@pytest.mark.parametrize("event", ALL_EVENTS)
def test_relevant_event_moves_unschedulable_pod_to_active_after_backoff(
    event: ClusterEvent,
) -> None:
    queue, clock = make_queue()
    pod, _ = put_in(queue, clock, QueueName.UNSCHEDULABLE)
    clock.advance(1.0)
    assert queue.flush() == (0, 0), "unschedulable pods wait for events, not for backoff"
    assert queue.move_all_on_event(event) == 1
    assert queue.where(pod.key) is QueueName.ACTIVE


def test_node_update_that_changed_nothing_relevant_moves_nothing() -> None:
    queue, clock = make_queue()
    pod, _ = put_in(queue, clock, QueueName.UNSCHEDULABLE)
    event = ClusterEvent(ClusterEventType.NODE_CHANGED, NodeChange.NONE, subject="n1")
    assert not event.of_interest
    assert queue.move_all_on_event(event) == 0
    assert queue.where(pod.key) is QueueName.UNSCHEDULABLE


@pytest.mark.parametrize(
    "event_type", [t for t in ClusterEventType if t is not ClusterEventType.NODE_CHANGED], ids=str
)
def test_node_changes_belong_to_node_changed_only(event_type: ClusterEventType) -> None:
    with pytest.raises(ValueError, match="node_changes"):
        ClusterEvent(event_type, NodeChange.LABELS)


def test_pre_check_narrows_the_move() -> None:
    queue, clock = make_queue()
    mine, _ = put_in(queue, clock, QueueName.UNSCHEDULABLE, name="mine")
    other, _ = put_in(queue, clock, QueueName.UNSCHEDULABLE, name="other")
    event = ClusterEvent(ClusterEventType.POD_BOUND, subject="default/web-0")
    assert queue.move_all_on_event(event, pre_check=lambda p: p.name == "mine") == 1
    assert queue.where(mine.key) is QueueName.BACKOFF
    assert queue.where(other.key) is QueueName.UNSCHEDULABLE


@pytest.mark.parametrize(
    "where", [QueueName.ACTIVE, QueueName.BACKOFF, QueueName.GATED, QueueName.IN_FLIGHT], ids=str
)
def test_events_only_move_unschedulable_pods(where: QueueName) -> None:
    queue, clock = make_queue()
    pod, _ = put_in(queue, clock, where)
    assert queue.move_all_on_event(NODE_ADDED) == 0
    assert queue.where(pod.key) is where


# -- events while in flight ---------------------------------------------------------------

Step = Callable[[SchedulingQueue[FakePod], FakePod], object]


def _event(queue: SchedulingQueue[FakePod], _pod: FakePod) -> object:
    return queue.move_all_on_event(NODE_ADDED)


def _no_op_event(queue: SchedulingQueue[FakePod], _pod: FakePod) -> object:
    return queue.move_all_on_event(ClusterEvent(ClusterEventType.NODE_CHANGED))


def _relevant_update(queue: SchedulingQueue[FakePod], pod: FakePod) -> object:
    return queue.update(pod.with_label("app", "web"))


def _same_update(queue: SchedulingQueue[FakePod], pod: FakePod) -> object:
    return queue.update(pod)


@pytest.mark.parametrize(
    ("during_flight", "expected"),
    [
        pytest.param(None, QueueName.UNSCHEDULABLE, id="nothing-happened"),
        pytest.param(_event, QueueName.BACKOFF, id="event"),
        pytest.param(_no_op_event, QueueName.UNSCHEDULABLE, id="event-of-no-interest"),
        pytest.param(_relevant_update, QueueName.BACKOFF, id="pod-updated"),
        pytest.param(_same_update, QueueName.UNSCHEDULABLE, id="pod-update-irrelevant"),
    ],
)
def test_event_during_flight_is_not_lost(during_flight: Step | None, expected: QueueName) -> None:
    queue, _ = make_queue()
    pod = make_pod("a")
    queue.add(pod)
    attempt = pop(queue)
    if during_flight is not None:
        during_flight(queue, pod)
    assert queue.where(pod.key) is QueueName.IN_FLIGHT
    assert queue.requeue_after_failure(attempt, unschedulable=True, reason="0/3 fit") is expected


def test_event_counts_for_pods_popped_before_it_only() -> None:
    queue, _ = make_queue()
    for name in "ab":
        queue.add(make_pod(name))
    a = pop(queue)
    queue.move_all_on_event(NODE_ADDED)
    b = pop(queue)
    assert (a.cycle, b.cycle) == (1, 2)
    assert queue.scheduling_cycle == 2
    assert queue.requeue_after_failure(b, unschedulable=True, reason="x") is (
        QueueName.UNSCHEDULABLE
    )
    assert queue.requeue_after_failure(a, unschedulable=True, reason="x") is QueueName.BACKOFF


def test_in_flight_update_applies_when_the_attempt_ends() -> None:
    queue, clock = make_queue()
    pod, attempt = put_in(queue, clock, QueueName.IN_FLIGHT)
    assert attempt is not None
    newer = pod.with_priority(7)
    assert queue.update(newer) is QueueName.IN_FLIGHT
    queue.requeue_after_failure(attempt, unschedulable=False, reason="conflict")
    info = queue.get(pod.key)
    assert info is not None
    assert (info.pod, info.last_failure, info.attempts) == (newer, "conflict", 1)


# -- unschedulable timeout ----------------------------------------------------------------


def test_unschedulable_pods_are_retried_after_max_stay() -> None:
    queue, clock = make_queue()
    first, _ = put_in(queue, clock, QueueName.UNSCHEDULABLE, name="first")
    clock.advance(100)
    second, _ = put_in(queue, clock, QueueName.UNSCHEDULABLE, name="second")
    stay = queue.config.max_unschedulable_stay
    deadline = clock.now() - 100 + stay
    assert queue.next_flush_at() == deadline
    assert queue.flush(deadline - 0.001) == (0, 0)
    assert queue.flush(deadline) == (0, 1)
    assert queue.where(first.key) is QueueName.ACTIVE
    assert queue.where(second.key) is QueueName.UNSCHEDULABLE
    assert queue.flush(deadline + 100) == (0, 1)
    assert queue.next_flush_at() is None


def test_timed_out_pod_still_backing_off_goes_to_backoff() -> None:
    queue, clock = make_queue(max_unschedulable_stay=1.0, initial_backoff=5, max_backoff=5)
    pod, _ = put_in(queue, clock, QueueName.UNSCHEDULABLE)
    clock.advance(1.0)
    assert queue.flush() == (0, 1)
    assert queue.where(pod.key) is QueueName.BACKOFF
    clock.advance(4.0)
    assert queue.flush() == (1, 0)
    assert queue.where(pod.key) is QueueName.ACTIVE


# -- update and delete in every place -----------------------------------------------------

EVERY_PLACE = [pytest.param(q, id=str(q)) for q in QueueName]


@pytest.mark.parametrize("where", EVERY_PLACE)
def test_delete_from_every_place(where: QueueName) -> None:
    queue, clock = make_queue()
    pod, attempt = put_in(queue, clock, where)
    assert queue.delete(pod.recreated()) is False, "a stale uid deletes nothing"
    assert queue.where(pod.key) is where
    assert queue.delete(pod) is True
    assert queue.where(pod.key) is None
    assert len(queue) == 0
    assert queue.delete(pod) is False
    if attempt is not None:
        assert queue.done(attempt) is False
        assert queue.requeue_after_failure(attempt, unschedulable=True, reason="x") is None
        assert len(queue) == 0


@pytest.mark.parametrize(
    ("where", "irrelevant", "relevant"),
    [
        pytest.param(QueueName.ACTIVE, QueueName.ACTIVE, QueueName.ACTIVE, id="active"),
        pytest.param(QueueName.BACKOFF, QueueName.BACKOFF, QueueName.BACKOFF, id="backoff"),
        pytest.param(
            QueueName.UNSCHEDULABLE, QueueName.UNSCHEDULABLE, QueueName.BACKOFF, id="unschedulable"
        ),
        pytest.param(QueueName.GATED, QueueName.GATED, QueueName.GATED, id="gated"),
        pytest.param(QueueName.IN_FLIGHT, QueueName.IN_FLIGHT, QueueName.IN_FLIGHT, id="in_flight"),
    ],
)
def test_update_in_every_place(
    where: QueueName, irrelevant: QueueName, relevant: QueueName
) -> None:
    queue, clock = make_queue()
    pod, _ = put_in(queue, clock, where)
    assert queue.update(pod) is irrelevant
    changed = pod.with_label("app", "web")
    assert queue.update(changed) is relevant
    info = queue.get(pod.key)
    assert info is not None
    assert info.pod == changed, "the queue keeps the latest version"
    assert len(queue) == 1


def test_relevant_update_after_backoff_moves_unschedulable_pod_to_active() -> None:
    queue, clock = make_queue()
    pod, _ = put_in(queue, clock, QueueName.UNSCHEDULABLE)
    clock.advance(1.0)
    assert queue.update(pod.with_label("app", "web")) is QueueName.ACTIVE


def test_custom_relevance_decides_what_update_matters() -> None:
    clock = FakeClock()
    queue: SchedulingQueue[FakePod] = SchedulingQueue(
        clock=clock, is_relevant_update=lambda old, new: old.priority != new.priority
    )
    pod, _ = put_in(queue, clock, QueueName.UNSCHEDULABLE)
    assert queue.update(pod.with_label("app", "web")) is QueueName.UNSCHEDULABLE
    assert queue.update(pod.with_priority(1)) is QueueName.BACKOFF


@pytest.mark.parametrize("where", EVERY_PLACE)
def test_recreated_pod_starts_afresh(where: QueueName) -> None:
    queue, clock = make_queue()
    pod, attempt = put_in(queue, clock, where)
    fresh = pod.recreated()
    assert queue.update(fresh) is (QueueName.GATED if fresh.scheduling_gates else QueueName.ACTIVE)
    info = queue.get(pod.key)
    assert info is not None
    assert (info.pod.uid, info.attempts, info.last_failure) == (fresh.uid, 0, "")
    assert len(queue) == 1
    if attempt is not None:
        assert queue.done(attempt) is False, "the old incarnation's attempt is stale"
        assert queue.get(pod.key) == info


@pytest.mark.parametrize("where", EVERY_PLACE)
def test_add_of_a_known_pod_is_an_update(where: QueueName) -> None:
    queue, clock = make_queue()
    pod, _ = put_in(queue, clock, where)
    assert queue.add(pod) is where
    assert len(queue) == 1


def test_update_of_an_unknown_pod_adds_it() -> None:
    queue, _ = make_queue()
    assert queue.update(make_pod("a")) is QueueName.ACTIVE
    assert queue.update(make_pod("g", gates=(GATE,))) is QueueName.GATED


# -- attempts -----------------------------------------------------------------------------


def test_done_removes_the_pod_and_only_once() -> None:
    queue, clock = make_queue()
    pod, attempt = put_in(queue, clock, QueueName.IN_FLIGHT)
    assert attempt is not None
    assert (attempt.attempts, attempt.first_queued_at, attempt.last_failure) == (
        1,
        clock.now(),
        "",
    )
    assert queue.done(attempt) is True
    assert queue.where(pod.key) is None
    assert queue.done(attempt) is False
    assert queue.requeue_after_failure(attempt, unschedulable=False, reason="x") is None


def test_handle_of_an_earlier_attempt_is_stale() -> None:
    queue, _ = make_queue(initial_backoff=0, max_backoff=0)
    queue.add(make_pod("a"))
    first = pop(queue)
    queue.requeue_after_failure(first, unschedulable=False, reason="x")
    second = pop(queue)
    assert second.attempts == 2
    assert queue.done(first) is False
    assert queue.done(second) is True


def test_counts_and_introspection() -> None:
    queue, clock = make_queue()
    # Active last: put_in pops the head of active to reach the other places.
    places = [q for q in QueueName if q is not QueueName.ACTIVE] + [QueueName.ACTIVE]
    for i, where in enumerate(places):
        put_in(queue, clock, where, name=f"p{i}")
    assert queue.counts() == dict.fromkeys(QueueName, 1)
    assert len(queue) == len(QueueName)
    assert pod_key("default", "p0") in queue
    assert PodKey("default/nope") not in queue
    assert queue.get(PodKey("default/nope")) is None
    for where in QueueName:
        assert len(queue.pods(where)) == queue.count(where) == 1


def test_pending_queue_names_are_the_metric_labels() -> None:
    assert tuple(str(q) for q in PENDING_QUEUES) == QUEUE_LABELS

"""pop: waits for an active pod, wakes on whatever makes one active, and ends on close()."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from scheduler.control.queue import QueuedPodInfo, QueueName, SchedulingQueue
from tests.control.builders import NODE_ADDED, FakeClock, FakePod, make_pod, make_queue, put_in

pytestmark = pytest.mark.usefixtures("no_leaked_tasks")

Waker = Callable[[SchedulingQueue[FakePod], FakeClock], None]


async def _settle() -> None:
    """Let every ready task run until it blocks again."""
    for _ in range(5):
        await asyncio.sleep(0)


async def _waiting_pop(
    queue: SchedulingQueue[FakePod],
) -> asyncio.Task[QueuedPodInfo[FakePod] | None]:
    task = asyncio.create_task(queue.pop())
    await _settle()
    assert not task.done(), "pop should be waiting"
    return task


def _add(queue: SchedulingQueue[FakePod], _clock: FakeClock) -> None:
    queue.add(make_pod("p"))


def _ungate(queue: SchedulingQueue[FakePod], clock: FakeClock) -> None:
    pod, _ = put_in(queue, clock, QueueName.GATED)
    queue.update(pod.with_gates())


def _backoff_expires(queue: SchedulingQueue[FakePod], clock: FakeClock) -> None:
    put_in(queue, clock, QueueName.BACKOFF)
    clock.advance(1.0)
    queue.flush()


def _event_after_backoff(queue: SchedulingQueue[FakePod], clock: FakeClock) -> None:
    put_in(queue, clock, QueueName.UNSCHEDULABLE)
    clock.advance(1.0)
    queue.move_all_on_event(NODE_ADDED)


def _stay_expires(queue: SchedulingQueue[FakePod], clock: FakeClock) -> None:
    put_in(queue, clock, QueueName.UNSCHEDULABLE)
    clock.advance(queue.config.max_unschedulable_stay)
    queue.flush()


@pytest.mark.parametrize(
    "waker",
    [
        pytest.param(_add, id="add"),
        pytest.param(_ungate, id="ungate"),
        pytest.param(_backoff_expires, id="backoff-flush"),
        pytest.param(_event_after_backoff, id="event"),
        pytest.param(_stay_expires, id="unschedulable-timeout"),
    ],
)
async def test_pop_wakes_when_a_pod_becomes_active(waker: Waker) -> None:
    queue, clock = make_queue()
    task = await _waiting_pop(queue)
    # put_in pops through try_pop itself; the waiting pop must not steal that pod.
    waker(queue, clock)
    info = await asyncio.wait_for(task, timeout=5)
    assert info is not None
    assert queue.where(info.key) is QueueName.IN_FLIGHT


@pytest.mark.parametrize(
    "place", [QueueName.BACKOFF, QueueName.UNSCHEDULABLE, QueueName.GATED], ids=str
)
async def test_pop_keeps_waiting_while_nothing_is_active(place: QueueName) -> None:
    """kube before SchedulerPopFromBackoffQ (the gate off): a pod backing off is not
    poppable before its backoff ends, even with nothing else to do."""
    queue, clock = make_queue(pop_from_backoff=False)
    put_in(queue, clock, place)
    task = await _waiting_pop(queue)
    queue.move_all_on_event(NODE_ADDED)  # to backoff at most: not poppable yet
    await _settle()
    assert not task.done()
    queue.close()
    assert await asyncio.wait_for(task, timeout=5) is None


async def test_pop_takes_a_pod_backing_off_while_nothing_is_active() -> None:
    """SchedulerPopFromBackoffQ (on by default, as in kube since 1.33): the event that
    moves an unschedulable pod to backoff (e.g. its preemption's victims gone) wakes a
    waiting pop, which takes it before its backoff ends."""
    queue, clock = make_queue()
    put_in(queue, clock, QueueName.UNSCHEDULABLE)
    task = await _waiting_pop(queue)
    queue.move_all_on_event(NODE_ADDED)
    info = await asyncio.wait_for(task, timeout=5)
    assert info is not None
    assert queue.where(info.key) is QueueName.IN_FLIGHT
    assert info.attempts == 2


async def test_a_pod_backing_off_after_an_error_waits_its_backoff_out() -> None:
    """As kube's separate error backoff queue: popped at once, it would spin on the error."""
    queue, clock = make_queue()
    _, attempt = put_in(queue, clock, QueueName.IN_FLIGHT)
    assert attempt is not None
    placed = queue.requeue_after_failure(attempt, unschedulable=False, reason="API down")
    assert placed is QueueName.BACKOFF
    task = await _waiting_pop(queue)  # nothing active, and not poppable early
    clock.advance(1.0)
    queue.flush()
    info = await asyncio.wait_for(task, timeout=5)
    assert info is not None
    assert info.attempts == 2


async def test_a_pod_the_caller_keeps_out_waits_its_backoff_out() -> None:
    """``pops_early`` (the scheduler keeps gangs out: one retried at once re-planned while
    its victims were still terminating)."""
    queue: SchedulingQueue[FakePod]
    clock = FakeClock()
    queue = SchedulingQueue(clock=clock, pops_early=lambda p: p.name != "gang")
    gang, _ = put_in(queue, clock, QueueName.UNSCHEDULABLE, name="gang")
    queue.move_all_on_event(NODE_ADDED)
    assert queue.where(gang.key) is QueueName.BACKOFF
    assert queue.try_pop() is None
    clock.advance(1.0)
    queue.flush()
    info = queue.try_pop()
    assert info is not None
    assert info.pod.name == "gang"


async def test_an_active_pod_goes_before_one_backing_off() -> None:
    queue, clock = make_queue()
    late, _ = put_in(queue, clock, QueueName.UNSCHEDULABLE)
    queue.move_all_on_event(NODE_ADDED)  # unschedulable, moved: backing off
    assert queue.where(late.key) is QueueName.BACKOFF
    queue.add(make_pod("fresh"))
    first = await queue.pop()
    second = await queue.pop()
    assert first is not None
    assert second is not None
    assert (first.pod.name, second.pod.name) == ("fresh", late.name)
    assert queue.try_pop() is None


async def test_close_wakes_every_waiting_pop() -> None:
    queue, _ = make_queue()
    tasks = [await _waiting_pop(queue) for _ in range(3)]
    queue.close()
    assert await asyncio.wait_for(asyncio.gather(*tasks), timeout=5) == [None, None, None]
    assert queue.closed


async def test_pop_after_close_returns_none_even_with_active_pods() -> None:
    queue, _ = make_queue()
    queue.add(make_pod("a"))
    queue.close()
    assert await queue.pop() is None
    assert queue.try_pop() is None
    assert queue.count(QueueName.ACTIVE) == 1, "close keeps the pods for inspection"


async def test_one_pod_wakes_one_of_two_waiters() -> None:
    queue, _ = make_queue()
    first, second = await _waiting_pop(queue), await _waiting_pop(queue)
    queue.add(make_pod("a"))
    await _settle()
    done = [t for t in (first, second) if t.done()]
    assert len(done) == 1
    info = done[0].result()
    assert info is not None
    assert info.pod.name == "a"
    queue.close()
    assert await asyncio.wait_for(asyncio.gather(first, second), timeout=5) is not None


async def test_pop_returns_immediately_when_active() -> None:
    queue, _ = make_queue()
    queue.add(make_pod("a", priority=1))
    queue.add(make_pod("b", priority=2))
    names = []
    for _ in range(2):
        info = await queue.pop()
        assert info is not None
        names.append(info.pod.name)
    assert names == ["b", "a"]

"""Reports go through one bounded queue with one writer: newer replaces older, a bound pod's
unsent failure is dropped, a full queue drops and counts, at most ``in_flight`` at once."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, cast

from scheduler.control.kubeio import KubeWriter, PodRef
from scheduler.control.reporter import Reporter


class SlowWriter:
    """Records writes; each waits for ``gate`` so tests can see what is queued meanwhile."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.events: list[tuple[str, str, str]] = []
        self.conditions: list[tuple[str, str]] = []
        self.running = 0
        self.most_running = 0

    async def _wait(self) -> None:
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        await self.gate.wait()
        self.running -= 1

    async def event(self, pod: PodRef, *, reason: str, message: str, **_: Any) -> None:
        await self._wait()
        self.events.append((pod.name, reason, message))

    async def mark_unschedulable(self, pod: PodRef, message: str, *, reason: str, **_: Any) -> None:
        await self._wait()
        self.conditions.append((pod.name, message))


def reporter(capacity: int = 100, in_flight: int = 2) -> tuple[Reporter, SlowWriter, list[Any]]:
    writer = SlowWriter()
    tasks: list[asyncio.Task[None]] = []
    drops: list[int] = []

    def spawn(coro: Coroutine[Any, Any, None]) -> None:
        tasks.append(asyncio.ensure_future(coro))

    r = Reporter(
        cast(KubeWriter, writer),
        spawn=spawn,
        clock=lambda: 0.0,
        repeat_after=60.0,
        capacity=capacity,
        in_flight=in_flight,
        on_drop=lambda: drops.append(1),
    )
    return r, writer, [tasks, drops]


def ref(i: int) -> PodRef:
    return PodRef("ns", f"p{i}", f"uid-{i}")


async def finish(writer: SlowWriter, tasks: list[asyncio.Task[None]]) -> None:
    writer.gate.set()
    await asyncio.gather(*tasks)


async def test_a_newer_failure_replaces_the_unsent_one_and_keeps_its_event() -> None:
    r, writer, (tasks, _) = reporter(in_flight=1)
    r.event(ref(0), reason="Scheduled", message="busy")  # occupies the only slot
    await asyncio.sleep(0)
    r.failed(ref(1), "0/3 nodes: cpu")
    r.failed(ref(1), "0/3 nodes: memory")
    assert r.waiting == 1
    await finish(writer, tasks)
    assert writer.events == [
        ("p0", "Scheduled", "busy"),
        ("p1", "FailedScheduling", "0/3 nodes: memory"),
    ]
    assert writer.conditions == [("p1", "0/3 nodes: memory")]
    assert len(tasks) == 1  # one writer task for all of it


async def test_an_unchanged_failure_is_not_written_again() -> None:
    r, writer, (tasks, _) = reporter()
    r.failed(ref(1), "same")
    await finish(writer, tasks)
    r.failed(ref(1), "same")
    assert r.waiting == 0
    assert len(writer.events) == 1


async def test_a_bound_pods_unsent_failure_is_dropped() -> None:
    r, writer, (tasks, _) = reporter(in_flight=1)
    r.event(ref(0), reason="Scheduled", message="busy")
    await asyncio.sleep(0)
    r.failed(ref(1), "0/3 nodes")
    r.forget("uid-1")  # bound meanwhile: PodScheduled=False must not follow the binding
    await finish(writer, tasks)
    assert writer.conditions == []
    assert [e[0] for e in writer.events] == ["p0"]


async def test_a_full_queue_drops_and_counts_and_says_it_again_later() -> None:
    r, writer, (tasks, drops) = reporter(capacity=2, in_flight=1)
    r.event(ref(0), reason="Scheduled", message="busy")
    await asyncio.sleep(0)  # taken by the writer: the queue is empty again
    for i in (1, 2, 3):
        r.failed(ref(i), "no room")
    assert (r.waiting, r.dropped, len(drops)) == (2, 1, 1)
    await finish(writer, tasks)
    r.failed(ref(3), "no room")  # not remembered as said: written now
    writer.gate.set()
    await asyncio.gather(*tasks)
    assert ("p3", "FailedScheduling", "no room") in writer.events


async def test_a_nomination_is_queued_even_when_the_queue_is_full() -> None:
    r, writer, (tasks, drops) = reporter(capacity=2, in_flight=1)
    r.event(ref(0), reason="Scheduled", message="busy")
    await asyncio.sleep(0)
    r.failed(ref(1), "no room")
    r.failed(ref(2), "no room")
    r.failed(ref(3), "no room", nominated="node-7")  # a preemptor: never dropped
    r.failed(ref(4), "no room")  # chatter: dropped
    assert (r.waiting, r.dropped, len(drops)) == (3, 1, 1)
    await finish(writer, tasks)
    assert ("p3", "no room") in writer.conditions
    assert ("p4", "no room") not in writer.conditions


async def test_at_most_in_flight_writes_at_once() -> None:
    r, writer, (tasks, _) = reporter(in_flight=3)
    for i in range(20):
        r.event(ref(i), reason="Scheduled", message="ok")
    for _ in range(5):
        await asyncio.sleep(0)
    assert writer.running == 3
    await finish(writer, tasks)
    assert (writer.most_running, len(writer.events)) == (3, 20)

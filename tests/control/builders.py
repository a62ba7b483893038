"""Small builders for queue and lifecycle tests: a pod record, a fake clock, a primed queue."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Final

from scheduler.control.queue import (
    ClusterEvent,
    ClusterEventType,
    PodKey,
    QueueConfig,
    QueuedPodInfo,
    QueueName,
    SchedulingQueue,
    pod_key,
)

_uids = itertools.count(1)

NODE_ADDED: Final = ClusterEvent(ClusterEventType.NODE_ADDED, subject="n1")


def _next_uid() -> str:
    return f"uid-{next(_uids)}"


@dataclass(frozen=True, slots=True)
class FakePod:
    """The fields the queue reads, plus labels standing in for the rest of the spec."""

    name: str
    namespace: str = "default"
    uid: str = field(default_factory=_next_uid)
    priority: int = 0
    scheduling_gates: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> PodKey:
        return pod_key(self.namespace, self.name)

    def with_priority(self, priority: int) -> FakePod:
        return replace(self, priority=priority)

    def with_gates(self, *gates: str) -> FakePod:
        return replace(self, scheduling_gates=gates)

    def with_label(self, key: str, value: str) -> FakePod:
        return replace(self, labels=(*self.labels, (key, value)))

    def recreated(self) -> FakePod:
        """Same name, new uid: deleted and created again."""
        return replace(self, uid=_next_uid())


def make_pod(name: str, *, priority: int = 0, gates: tuple[str, ...] = ()) -> FakePod:
    return FakePod(name=name, priority=priority, scheduling_gates=gates)


class FakeClock:
    """A clock that moves only when told, and only forward."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> float:
        assert seconds >= 0, "time does not go back"
        self.t += seconds
        return self.t


def make_queue(
    clock: FakeClock | None = None, **config: Any
) -> tuple[SchedulingQueue[FakePod], FakeClock]:
    clock = FakeClock() if clock is None else clock
    return SchedulingQueue(clock=clock, config=QueueConfig(**config)), clock


def pop(queue: SchedulingQueue[FakePod]) -> QueuedPodInfo[FakePod]:
    """Pop that must succeed."""
    info = queue.try_pop()
    assert info is not None, f"nothing to pop: {queue.counts()}"
    return info


def put_in(
    queue: SchedulingQueue[FakePod], clock: FakeClock, where: QueueName, name: str = "p"
) -> tuple[FakePod, QueuedPodInfo[FakePod] | None]:
    """A pod that sits in ``where`` (through the public API only); its attempt handle if it
    is in flight."""
    if where is QueueName.GATED:
        pod = make_pod(name, gates=("example.com/wait",))
        assert queue.add(pod) is QueueName.GATED
        return pod, None
    pod = make_pod(name)
    assert queue.add(pod) is QueueName.ACTIVE
    if where is QueueName.ACTIVE:
        return pod, None
    info = pop(queue)
    assert info.pod == pod
    if where is QueueName.IN_FLIGHT:
        return pod, info
    placed = queue.requeue_after_failure(
        info, unschedulable=where is QueueName.UNSCHEDULABLE, reason="test"
    )
    assert placed is where, placed
    return pod, None

"""The binding cycle's contract (issue #36, item 0), with steps that record what ran: the
PreBind steps run in order; on any failure (a step's reason, the binding's error, an
exception, an undo that raises) every step is undone exactly once, in reverse, whether
or not it ran; then the assumption and the nomination; and the outcome is settled once."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from structlog.testing import capture_logs

from scheduler.control.binding_cycle import POD_GONE, Binding, Cycle, Step
from scheduler.control.queue import QueuedPodInfo, QueueName, pod_key
from scheduler.control.queued import QueuedPod
from scheduler.control.scheduler import Scheduler
from scheduler.model.pod import Pod
from tests.builders import make_pod
from tests.control.test_gangs import FakeWriter, scheduler


class Recorded:
    """A step that notes its run and undo in ``trail``; it may fail, raise, or raise in
    its undo."""

    def __init__(
        self,
        name: str,
        trail: list[tuple[str, str]],
        *,
        fails: str | None = None,
        raises: bool = False,
        undo_raises: bool = False,
    ) -> None:
        self.plugin = name
        self.failed_event = f"{name}_failed"
        self.gone_reason = f"deleted during {name}"
        self._trail = trail
        self._fails = fails
        self._raises = raises
        self._undo_raises = undo_raises

    async def run(self, cycle: Cycle) -> str | None:
        self._trail.append(("run", self.plugin))
        if self._raises:
            raise RuntimeError(f"a bug in {self.plugin}")
        return self._fails

    async def undo(self, cycle: Cycle) -> None:
        self._trail.append(("undo", self.plugin))
        if self._undo_raises:
            raise RuntimeError(f"a bug in {self.plugin}'s undo")


def assumed(sched: Scheduler) -> tuple[QueuedPodInfo[QueuedPod], Pod]:
    """Pod ``p`` popped and assumed on n1, as a scheduling cycle leaves it."""
    body = make_pod("p", "1").obj()
    body["spec"]["schedulerName"] = "lattice"
    sched.pod_upserted(body)
    info = sched.queue.try_pop()
    assert info is not None
    pod = info.pod
    assert isinstance(pod, Pod)
    sched.cache.assume(pod, "n1", {})
    return info, pod


async def bind(
    sched: Scheduler,
    info: QueuedPodInfo[QueuedPod],
    pod: Pod,
    steps: list[Step],
    *,
    nominate: bool = True,
) -> list[MutableMapping[str, Any]]:
    """Run the cycle with ``steps`` and let what it spawned finish; its log lines."""
    with capture_logs() as logs:
        cycle = Cycle(pod, "n1", sched.log, "trace")
        await sched.binding_cycle.run(Binding(info, cycle, {}, steps, nominate=nominate))
        await sched.drain(5)
    return logs


def failed_with(writer: FakeWriter) -> list[str]:
    return [e[3] for e in writer.events if e[1] == "p" and e[2] == "FailedScheduling"]


def nominations(writer: FakeWriter) -> list[Any]:
    return [s.get("nominatedNodeName") for p, s in writer.status_patches if p == "p"]


def assert_unwound(sched: Scheduler) -> None:
    assert sched.cache.cached_pod(pod_key("default", "p")) is None
    assert sched.cache.snapshot.pod_counts.sum() == 0


async def test_the_steps_run_in_order_and_the_pod_binds() -> None:
    sched, writer = scheduler()
    info, pod = assumed(sched)
    trail: list[tuple[str, str]] = []
    await bind(sched, info, pod, [Recorded("a", trail), Recorded("b", trail)])
    assert trail == [("run", "a"), ("run", "b")]
    assert writer.binds == [("p", "n1")]
    assert nominations(writer) == ["n1"]  # written before the PreBind; the binding clears it
    assert sched.counters.scheduled == 1
    assert sched.queue.where(pod_key("default", "p")) is None


async def test_a_failed_step_undoes_every_step_in_reverse_and_requeues_the_pod() -> None:
    """Step c never ran, yet is undone (its Reserve is), first: reverse order."""
    sched, writer = scheduler()
    info, pod = assumed(sched)
    trail: list[tuple[str, str]] = []
    steps: list[Step] = [
        Recorded("a", trail),
        Recorded("b", trail, fails="no room"),
        Recorded("c", trail),
    ]
    logs = await bind(sched, info, pod, steps)
    assert trail == [("run", "a"), ("run", "b"), ("undo", "c"), ("undo", "b"), ("undo", "a")]
    assert writer.binds == []
    assert_unwound(sched)
    assert sched.queue.where(pod_key("default", "p")) is QueueName.BACKOFF
    assert failed_with(writer) == ['running PreBind plugin "b": no room']
    assert writer.conditions[-1][1] == "SchedulerError"
    assert nominations(writer) == ["n1", None]  # kube clears it when the cycle fails
    assert [e["event"] for e in logs if e["event"] == "b_failed"] == ["b_failed"]
    assert (sched.counters.errors, sched.counters.bind_errors) == (1, 0)


async def test_a_pod_gone_during_a_step_leaves_the_queue_without_a_report() -> None:
    sched, writer = scheduler()
    info, pod = assumed(sched)
    trail: list[tuple[str, str]] = []
    logs = await bind(
        sched, info, pod, [Recorded("a", trail), Recorded("b", trail, fails=POD_GONE)]
    )
    assert trail == [("run", "a"), ("run", "b"), ("undo", "b"), ("undo", "a")]
    assert_unwound(sched)
    assert sched.queue.where(pod_key("default", "p")) is None
    assert failed_with(writer) == []
    assert nominations(writer) == ["n1"]  # nothing left to clear
    (superseded,) = [e for e in logs if e["event"] == "binding_superseded"]
    assert superseded["reason"] == "deleted during b"
    assert sched.counters.errors == 0


async def test_a_failed_binding_undoes_every_step() -> None:
    sched, writer = scheduler()
    info, pod = assumed(sched)
    writer.fail.add("p")  # the binding answers 500
    trail: list[tuple[str, str]] = []
    await bind(sched, info, pod, [Recorded("a", trail), Recorded("b", trail)])
    assert trail == [("run", "a"), ("run", "b"), ("undo", "b"), ("undo", "a")]
    assert_unwound(sched)
    assert sched.queue.where(pod_key("default", "p")) is QueueName.BACKOFF
    assert failed_with(writer) == ["500: injected"]
    assert nominations(writer) == ["n1", None]
    assert (sched.counters.errors, sched.counters.bind_errors) == (0, 1)


async def test_a_step_that_raises_is_unwound_as_a_scheduler_error() -> None:
    """The last line of defence: a bug in a step costs the pod one attempt."""
    sched, writer = scheduler()
    info, pod = assumed(sched)
    trail: list[tuple[str, str]] = []
    logs = await bind(sched, info, pod, [Recorded("a", trail), Recorded("b", trail, raises=True)])
    assert trail == [("run", "a"), ("run", "b"), ("undo", "b"), ("undo", "a")]
    assert [e["event"] for e in logs if e["event"] == "binding_crashed"] == ["binding_crashed"]
    assert_unwound(sched)
    assert sched.queue.where(pod_key("default", "p")) is QueueName.BACKOFF
    assert failed_with(writer) == ["binding pod to n1: RuntimeError: a bug in b"]
    assert nominations(writer) == ["n1", None]
    assert sched.counters.errors == 1


async def test_an_undo_that_raises_is_not_run_again_and_the_rest_is_undone() -> None:
    sched, writer = scheduler()
    info, pod = assumed(sched)
    trail: list[tuple[str, str]] = []
    steps: list[Step] = [
        Recorded("a", trail),
        Recorded("b", trail, fails="no room", undo_raises=True),
    ]
    logs = await bind(sched, info, pod, steps)
    assert trail == [("run", "a"), ("run", "b"), ("undo", "b"), ("undo", "a")]
    assert [e["event"] for e in logs if e["event"] == "binding_crashed"] == ["binding_crashed"]
    assert_unwound(sched)
    assert sched.queue.where(pod_key("default", "p")) is QueueName.BACKOFF
    assert failed_with(writer) == ["binding pod to n1: RuntimeError: a bug in b's undo"]
    assert sched.counters.errors == 1

"""What the scheduler tells users about pods: Events and the PodScheduled condition.

Why a queue: a burst of bindings or of unschedulable pods produces a report per pod, and a
task per report would compete with the bindings for connections and the loop. Reports go
into one bounded, insertion-ordered map drained by a single writer task (started when there
is work, ended when there is none) with a few requests in flight, through the writer's own
rate limiter (``report_limiter``), never the bindings'.

Aggregation:

* FailedScheduling at most once per pod per :attr:`Reporter.repeat_after` seconds with an
  unchanged message; PodScheduled=False patched only when reason or message changed.
* A report not yet written is *replaced* by a newer one for the same pod and kind (the
  newest message wins; an event owed by the older one is still sent), so a pod that fails
  ten times while the API is slow costs one write, not ten.
* When a pod is bound or gone (:meth:`Reporter.forget`), its unsent failure is dropped: a
  late PodScheduled=False must not land after the binding.
* Full (``capacity`` distinct reports waiting, 1000 by default as client-go's event
  broadcaster, which kube-scheduler uses, queues at most 1000 and drops when full): new
  reports are dropped and counted (``lattice_reports_dropped_total``); what was not
  written is not remembered as said, so the next failure says it again. A failure that
  carries a preemption's ``nominatedNodeName`` is never dropped. After a burst of
  thousands of bindings the API server's time goes to the next bindings, not to a backlog
  of Scheduled events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Final

import structlog

from scheduler.control.kubeio import KubeWriter, PodRef

log = structlog.get_logger("lattice.reporter")

UNSCHEDULABLE: Final = "Unschedulable"
SCHEDULER_ERROR: Final = "SchedulerError"


@dataclass(slots=True)
class _Failure:
    ref: PodRef
    message: str
    reason: str
    trace_id: str
    event: bool
    """Send FailedScheduling (the dedupe said it is due)."""
    condition: bool
    """Patch PodScheduled=False (it says something new)."""
    nominated: str | None = None
    """A preemption's ``nominatedNodeName`` to write with the condition (``""``: clear it;
    None: leave it)."""


@dataclass(slots=True)
class _Event:
    ref: PodRef
    reason: str
    message: str
    warning: bool
    action: str
    trace_id: str
    kind: str
    api_version: str


_Job = _Failure | _Event


def _keeps_state(job: _Job) -> bool:
    """A preemption's nomination is state other schedulers and a new leader act on, not
    chatter: it is queued even when the queue is full (one per preemption, so bounded)."""
    return isinstance(job, _Failure) and job.nominated is not None


class Reporter:
    """One scheduler's reports (see the module docstring)."""

    def __init__(
        self,
        writer: KubeWriter,
        *,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        clock: Callable[[], float],
        repeat_after: float,
        capacity: int = 1000,
        in_flight: int = 8,
        on_drop: Callable[[], None] | None = None,
    ) -> None:
        self.writer = writer
        self._spawn = spawn
        self.clock = clock
        self.repeat_after = repeat_after
        """Seconds before an unchanged FailedScheduling is sent again: one per backoff window."""
        self.capacity = capacity
        self.in_flight = in_flight
        self._on_drop = on_drop
        self._jobs: dict[tuple[str, str], _Job] = {}
        self._writing = False
        self._conditions: dict[str, tuple[str, str]] = {}
        """Per pod uid, the PodScheduled reason and message last written (or seen)."""
        self._failure_events: dict[str, tuple[tuple[str, str], float]] = {}
        """Per pod uid, the last FailedScheduling reason and message, and when it was sent."""
        self.dropped = 0

    # -- what the scheduler says -------------------------------------------------------
    def failed(
        self,
        ref: PodRef,
        message: str,
        *,
        reason: str = UNSCHEDULABLE,
        trace_id: str = "",
        nominated: str | None = None,
    ) -> None:
        """FailedScheduling and PodScheduled=False, each only if it says something new;
        ``nominated`` (a node, or ``""`` to clear) is always written, with the condition."""
        said = (reason, message)
        now = self.clock()
        last = self._failure_events.get(ref.uid)
        event = last is None or last[0] != said or now - last[1] >= self.repeat_after
        condition = self._conditions.get(ref.uid) != said or nominated is not None
        if not event and not condition:
            return
        key = (ref.uid, "failure")
        older = self._jobs.get(key)
        if isinstance(older, _Failure):
            event = event or older.event
            condition = condition or older.condition
            if nominated is None:
                nominated = older.nominated
        job = _Failure(ref, message, reason, trace_id, event, condition, nominated)
        if not self._put(key, job):
            return
        if job.event:
            self._failure_events[ref.uid] = (said, now)
        if job.condition:
            self._conditions[ref.uid] = said

    def event(
        self,
        ref: PodRef,
        *,
        reason: str,
        message: str,
        warning: bool = False,
        action: str = "Scheduling",
        trace_id: str = "",
        kind: str = "Pod",
        api_version: str = "v1",
    ) -> None:
        """Any other Event (Scheduled; a PodGroup's GangPartial, ScheduleTimeout ...)."""
        job = _Event(ref, reason, message, warning, action, trace_id, kind, api_version)
        self._put((ref.uid, reason), job)

    def note_condition(self, uid: str, status: Mapping[str, Any]) -> None:
        """A pending pod's PodScheduled as the API has it, for a uid we never wrote (a new
        leader): an unchanged condition is then not patched again."""
        if uid in self._conditions:
            return  # what we wrote is newer than any view of it we may still receive
        for cond in status.get("conditions") or ():
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                self._conditions[uid] = (str(cond.get("reason", "")), str(cond.get("message", "")))

    def forget(self, uid: str) -> None:
        """The pod was bound or is gone: its memory, and its failure not yet written, go."""
        self._conditions.pop(uid, None)
        self._failure_events.pop(uid, None)
        self._jobs.pop((uid, "failure"), None)

    @property
    def waiting(self) -> int:
        return len(self._jobs)

    # -- the writer -------------------------------------------------------------------
    def _put(self, key: tuple[str, str], job: _Job) -> bool:
        if key in self._jobs:
            del self._jobs[key]  # the newer report takes the older one's place in line
        elif len(self._jobs) >= self.capacity and not _keeps_state(job):
            self.dropped += 1
            if self._on_drop is not None:
                self._on_drop()
            return False
        self._jobs[key] = job
        if not self._writing:
            self._writing = True
            self._spawn(self._write())
        return True

    async def _write(self) -> None:
        running: set[asyncio.Task[None]] = set()
        try:
            while self._jobs or running:
                while self._jobs and len(running) < self.in_flight:
                    key = next(iter(self._jobs))
                    job = self._jobs.pop(key)
                    running.add(asyncio.ensure_future(self._send(job)))
                _, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._writing = False
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    async def _send(self, job: _Job) -> None:
        try:
            await self._write_one(job)
        except Exception as exc:  # reporting is best effort; the pod stays queued
            log.warning("report_failed", pod=f"{job.ref.namespace}/{job.ref.name}", reason=str(exc))

    def _write_one(self, job: _Job) -> Awaitable[None]:
        if isinstance(job, _Event):
            return self.writer.event(
                job.ref,
                reason=job.reason,
                message=job.message,
                warning=job.warning,
                action=job.action,
                trace_id=job.trace_id or None,
                kind=job.kind,
                api_version=job.api_version,
            )
        return self._write_failure(job)

    async def _write_failure(self, job: _Failure) -> None:
        ref = job.ref
        if job.event:
            await self.writer.event(
                ref,
                reason="FailedScheduling",
                message=job.message,
                warning=True,
                trace_id=job.trace_id or None,
            )
        if job.condition:
            try:
                await self.writer.mark_unschedulable(
                    ref, job.message, reason=job.reason, nominated_node=job.nominated
                )
            except BaseException:
                if self._conditions.get(ref.uid) == (job.reason, job.message):
                    self._conditions.pop(ref.uid, None)  # not written: write it next time
                raise

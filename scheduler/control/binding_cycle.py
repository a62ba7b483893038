"""The binding cycle: kube-scheduler's contract after the decision, one error rule for all.

Reserve happened in the scheduling cycle: the pod assumed on its node, its predicted load
noted, its PVs and devices assumed. Permit is the gang's commit (it assumed all members or
none before their bindings start). What follows runs in the pod's binding task
(:meth:`BindingCycle.run`):

1. the pod nominated to its node when a PreBind has work (kube 1.35+,
   :func:`nominates_before_prebind`);
2. each PreBind :class:`Step` in order: VolumeBinding's
   (:class:`~scheduler.control.storage.VolumeBinding`, beside the storage objects), then
   DynamicResources' (:class:`~scheduler.control.dra_binding.DynamicResources`, beside the
   DRA objects);
3. the Bind (:class:`~scheduler.control.binder.Binder`).

Each step is paired with its undo (kube's Unreserve of the same plugin). On any failure
(a step's reason, the binding's error, an exception) every step is undone once, in reverse
order, whether or not its PreBind ran (the Reserve is undone too); then the assumption
(node room, predicted load) and the nomination (not for a pod that is gone: nothing is
left to clear). Then the outcome is settled by one function, :meth:`BindingCycle.settle`:
a pod gone meanwhile leaves the queue (its gang re-synced); a failure counts, requeues with
backoff and a SchedulerError (a gang member goes back to its gang: re-placed, or the gang
made partial); a binding done is counted, timed and reported.

The last line of defence: whatever is raised before the outcome is settled (a write error
no site turned into a failure, a bug) unwinds the same way and settles as a SchedulerError
(a gang member is re-placed at once only when the error is transient). No pod is left in
flight without an owner.
"""

from __future__ import annotations

import collections
import contextlib
import enum
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from scheduler.control.binder import Binder
from scheduler.control.cache import SchedulerCache
from scheduler.control.kubeio import BindResult, KubeWriter, PodRef
from scheduler.control.preemptor import Preemptor
from scheduler.control.queue import QueuedPodInfo, SchedulingQueue
from scheduler.control.queued import QueuedPod
from scheduler.control.reporter import SCHEDULER_ERROR, Reporter
from scheduler.control.settings import SchedulerSettings
from scheduler.control.transient import describe, is_transient
from scheduler.core.dra.state import ClaimPlan
from scheduler.core.volumes import VolumePlan
from scheduler.model.pod import Pod
from scheduler.obs.metrics import AttemptResult, Metrics
from scheduler.predict import LoadPredictor

if TYPE_CHECKING:
    from scheduler.control.gang_flow import GangFlow

POD_GONE: Final = "the pod is gone"
"""A step's reason when the pod was deleted during its PreBind: nothing to report."""


def nominates_before_prebind(
    pod: Pod, volume_plan: VolumePlan | None, claim_plan: ClaimPlan | None
) -> bool:
    """kube's PreBindPreFlight verdict, on which every supported release (1.35+,
    NominatedNodeNameForExpectation) nominates: DynamicResources has work for any pod with
    resource claims (its own, or one for extended resources the node serves from
    devices), VolumeBinding when some volume is still to be bound."""
    if pod.resource_claims or (claim_plan is not None and claim_plan.writes):
        return True
    return volume_plan is not None and not volume_plan.empty


@dataclass(frozen=True)
class Cycle:
    """One pod's binding as its steps read it."""

    pod: Pod
    node: str
    log: Any
    trace_id: str


class Step(Protocol):
    """One plugin's PreBind and its undo (kube's Unreserve for the same plugin)."""

    plugin: str
    """The plugin's name, in ``running PreBind plugin "<plugin>": <why>``."""
    failed_event: str
    """The log event of its failure."""
    gone_reason: str
    """``binding_superseded``'s reason when the pod went away during it."""

    async def run(self, cycle: Cycle) -> str | None:
        """The PreBind: None when done, :data:`POD_GONE`, or why it failed."""
        ...

    async def undo(self, cycle: Cycle) -> None:
        """Give back what Reserve and (if it ran) the PreBind took; called once, on any
        failure of the cycle, whether or not :meth:`run` was called."""
        ...


class PreBindWaits:
    """Pods (by uid) waiting in a PreBind for someone else (the PV controller, a device's
    binding conditions): one deleted meanwhile ends its wait at once rather than holding
    its node's room for the whole timeout."""

    def __init__(self) -> None:
        self._alive: dict[str, bool] = {}

    @contextlib.contextmanager
    def waiting(self, uid: str) -> Iterator[Callable[[], bool]]:
        """For the wait's duration: whether the pod is still there."""
        self._alive[uid] = True
        try:
            yield lambda: self._alive.get(uid, False)
        finally:
            self._alive.pop(uid, None)

    def gone(self, uid: str) -> None:
        """The pod was deleted (or bound elsewhere): its wait, if any, ends."""
        if uid in self._alive:
            self._alive[uid] = False


@dataclass
class Counters:
    scheduled: int = 0
    unschedulable: int = 0
    errors: int = 0
    bind_errors: int = 0


class Result(enum.Enum):
    BOUND = "bound"
    GONE = "gone"
    """Deleted, or bound elsewhere, meanwhile: it leaves the queue, nothing reported."""
    FAILED = "failed"
    """A PreBind failed, or the task raised: a SchedulerError."""
    BIND_FAILED = "bind_failed"
    """The binding itself failed (counted as a bind error too)."""


@dataclass(frozen=True)
class Outcome:
    result: Result
    reason: str = ""
    """The log's reason; for a failure also the queue's and the FailedScheduling message."""
    event: str = ""
    """The failure's log event (none: logged already, as ``binding_crashed``)."""
    replace: bool = True
    """A gang member's failure: re-place it at once (else it goes back to its gang)."""


@dataclass
class Binding:
    """One assumed pod on its way to its node.

    ``info`` is the queue's handle of a single pod; gang members have none (their gang's
    entry ended with the commit) and report to ``gang`` instead, with the gang entry's
    first-queued time and attempts in ``gang_queued`` for the SLI histogram."""

    info: QueuedPodInfo[QueuedPod] | None
    cycle: Cycle
    annotations: dict[str, str]
    steps: Sequence[Step] = ()
    nominate: bool = False
    """Write ``nominatedNodeName`` before the PreBind steps."""
    gang: str | None = None
    gang_queued: tuple[float | None, int] | None = None
    nominated: bool = False
    """The nomination was written (a failure clears it)."""
    undone: set[int] = field(default_factory=set)
    """Indexes of the steps undone (each is undone once)."""
    settled: bool = False
    """The outcome was handed to the queue, the gang or the cache: nothing left to undo."""

    @property
    def ref(self) -> PodRef:
        pod = self.cycle.pod
        return PodRef(pod.namespace, pod.name, pod.uid)

    @property
    def key(self) -> str:
        return f"{self.cycle.pod.namespace}/{self.cycle.pod.name}"


class BindingCycle:
    """Runs bindings (:meth:`run`) and settles their outcomes (:meth:`settle`): one path for
    single pods and gang members, so counters, metrics and events are kept in one place."""

    def __init__(
        self,
        *,
        cache: SchedulerCache,
        load: LoadPredictor,
        queue: SchedulingQueue[QueuedPod],
        gang_flow: GangFlow,
        preemptor: Preemptor,
        binder: Binder | None,
        writer: KubeWriter | None,
        reporter: Reporter | None,
        metrics: Metrics,
        counters: Counters,
        latencies: collections.deque[float],
        settings: Callable[[], SchedulerSettings],
        clock: Callable[[], float],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        forget_reports: Callable[[str], None],
    ) -> None:
        self._cache = cache
        self._load = load
        self._queue = queue
        self._gang_flow = gang_flow
        self._preemptor = preemptor
        self._binder = binder
        self._writer = writer
        self._reporter = reporter
        self._metrics = metrics
        self._counters = counters
        self._latencies = latencies
        self._settings = settings
        self._clock = clock
        self._spawn = spawn
        self._forget_reports = forget_reports

    async def run(self, b: Binding) -> None:
        """Run the cycle and settle its outcome; the last line of defence around it."""
        log, node = b.cycle.log, b.cycle.node
        try:
            await self._run(b)
        except Exception as exc:
            if b.settled:  # the outcome stands; only its bookkeeping broke
                log.exception("binding_settle_failed", node=node, reason=repr(exc))
                return
            try:
                await self._crashed(b, exc)
            except Exception as again:  # never an unretrieved task exception
                log.exception("binding_unwind_failed", node=node, reason=repr(again))

    async def _run(self, b: Binding) -> None:
        assert self._binder is not None
        cycle = b.cycle
        if b.nominate:
            b.nominated = await self._nominate(b)
        for step in b.steps:
            why = await step.run(cycle)
            if why is None:
                continue
            gone = why == POD_GONE
            await self._unwind(b, gone=gone)
            if gone:
                self.settle(b, Outcome(Result.GONE, step.gone_reason))
            else:
                message = f'running PreBind plugin "{step.plugin}": {why}'
                self.settle(b, Outcome(Result.FAILED, message, step.failed_event))
            return
        outcome = await self._binder.bind(b.ref, cycle.node, b.annotations)
        if outcome.result is BindResult.BOUND:
            b.settled = True
            self.settle(b, Outcome(Result.BOUND))
            return
        gone = outcome.result in (BindResult.BOUND_ELSEWHERE, BindResult.GONE)
        await self._unwind(b, gone=gone)
        if gone:
            self.settle(b, Outcome(Result.GONE, outcome.detail))
        else:
            self.settle(b, Outcome(Result.BIND_FAILED, outcome.detail, "binding_failed"))

    async def _crashed(self, b: Binding, exc: Exception) -> None:
        """Undo everything assumed for the pod and settle a SchedulerError. Each undo runs
        once: the cycle may have undone some of it before it raised."""
        message = f"binding pod to {b.cycle.node}: {describe(exc)}"
        b.cycle.log.error("binding_crashed", node=b.cycle.node, reason=message, exc_info=exc)
        b.settled = True
        await self._unwind(b, gone=False)
        # A lost request is re-placed at once, as a failed binding is; anything else goes
        # back to its gang (partial, first in line): a bug may recur, and a re-placement
        # would retry it without backoff.
        self.settle(b, Outcome(Result.FAILED, message, replace=is_transient(exc)))

    async def _unwind(self, b: Binding, *, gone: bool) -> None:
        """Every step undone once, in reverse; then the pod's node room and predicted load;
        then the nomination (kube clears it when the binding cycle fails, ModeOverride "")
        unless the pod is gone."""
        cycle = b.cycle
        for i in reversed(range(len(b.steps))):
            if i in b.undone:
                continue
            b.undone.add(i)
            await b.steps[i].undo(cycle)
        self._cache.forget(cycle.pod)
        self._load.forget_pod(b.key)
        if b.nominated and not gone:
            b.nominated = False
            self._clear_nomination(b.ref, cycle.log)
        b.settled = True

    def settle(self, b: Binding, outcome: Outcome) -> None:
        """The one place an outcome lands: queue, gang, counters, metrics, events."""
        if outcome.result is Result.BOUND:
            self._bound(b)
            return
        info, gang, key = b.info, b.gang, b.key
        pod, log = b.cycle.pod, b.cycle.log
        if outcome.result is Result.GONE:
            if info is not None:
                self._queue.done(info)
            if gang is not None:
                self._gang_flow.binding_ended(gang, key)
                self._gang_flow.sync(gang)
            log.info("binding_superseded", reason=outcome.reason)
            return
        if outcome.result is Result.BIND_FAILED:
            self._counters.bind_errors += 1
            self._metrics.bind_errors.inc()
        else:
            self._counters.errors += 1
        self._metrics.count_attempt(AttemptResult.ERROR, self._settings().scheduler_name)
        if outcome.event:
            log.warning(outcome.event, node=b.cycle.node, reason=outcome.reason)
        if gang is not None:
            self._gang_flow.binding_ended(gang, key)
            self._gang_flow.binding_failed(
                gang, pod, outcome.reason, log, b.cycle.trace_id, replace=outcome.replace
            )
            return
        if info is None:
            return
        requeued = self._queue.requeue_after_failure(
            info, unschedulable=False, reason=outcome.reason
        )
        # kube's handleSchedulingFailure: SchedulerError (not for a pod that left the queue
        # meanwhile: deleted, or its lost-reply binding landed and the watch showed it).
        if requeued is not None and self._reporter is not None:
            self._reporter.failed(
                b.ref, outcome.reason, reason=SCHEDULER_ERROR, trace_id=b.cycle.trace_id
            )

    def _bound(self, b: Binding) -> None:
        pod, node, log = b.cycle.pod, b.cycle.node, b.cycle.log
        info, clock = b.info, self._clock
        self._preemptor.end_nomination(pod.key)
        self._cache.finish_binding(pod, clock())
        self._counters.scheduled += 1
        self._forget_reports(pod.uid)
        # kube-scheduler counts "scheduled" once the binding succeeded.
        settings = self._settings()
        self._metrics.count_attempt(AttemptResult.SCHEDULED, settings.scheduler_name)
        queued = (info.first_queued_at, info.attempts) if info is not None else b.gang_queued
        if queued is not None and queued[0] is not None:
            self._metrics.observe_sli(clock() - queued[0], attempts=queued[1])
        if info is not None:
            self._queue.done(info)
            latency = clock() - (info.first_queued_at or clock())
            self._latencies.append(latency)
            self._metrics.e2e_scheduling_duration.observe(latency)
            log.info("pod_bound", node=node, duration_ms=round(latency * 1000, 3))
        else:
            log.info("pod_bound", node=node)
        if b.gang is not None:
            self._gang_flow.binding_ended(b.gang, b.key)
        if settings.scheduled_events and self._reporter is not None:
            self._reporter.event(
                b.ref,
                reason="Scheduled",
                action="Binding",
                trace_id=b.cycle.trace_id,
                message=f"Successfully assigned {pod.namespace}/{pod.name} to {node}",
            )

    async def _nominate(self, b: Binding) -> bool:
        """kube-scheduler 1.35+ (NominatedNodeNameForExpectation) writes the node as the
        pod's ``nominatedNodeName`` before a PreBind that has work to do, so that cluster
        autoscalers and other schedulers (kube-scheduler beside us counts nominations)
        do not hand the node's room away while claims or volumes are written. A failed
        write is logged and binding goes on, as in kube. The API server clears the field
        at binding; a failure clears it here."""
        assert self._writer is not None
        node = b.cycle.node
        try:
            written = await self._writer.patch_pod_status(b.ref, {"nominatedNodeName": node})
        except Exception as exc:  # not critical to the binding, as in kube
            b.cycle.log.warning("nomination_write_failed", node=node, error=str(exc))
            return False
        return written

    def _clear_nomination(self, ref: PodRef, log: Any) -> None:
        """kube clears the nomination when the binding cycle fails (ModeOverride, "")."""
        writer = self._writer
        assert writer is not None

        async def clear() -> None:
            try:
                await writer.patch_pod_status(ref, {"nominatedNodeName": None})
            except Exception as exc:  # the next attempt writes it again
                log.warning("nomination_clear_failed", error=str(exc))

        self._spawn(clear())

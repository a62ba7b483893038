"""The scheduler proper: watch events in, decisions out, bindings in the background.

Theory of operation (one asyncio loop, no threads, no locks):

* Watch handlers call ``pod_upserted`` / ``pod_deleted`` / ``node_upserted`` ...
  synchronously. A bound pod (anyone's) goes to the cache; a pending pod with
  our schedulerName goes to the queue; cluster changes move waiting pods.
* ``run`` (leader only) pops a pod, runs the pure core on the cache's snapshot
  (synchronous and cheap: no awaits inside a cycle, so the snapshot cannot
  change under it), assumes the pod on the chosen node, and hands the binding
  to a bounded pool of tasks. The next cycle starts at once and already sees
  the assumed pod.
* A binding that fails forgets the assumption and requeues with backoff; a
  409 for a pod already bound is resolved by reading the pod, never by a
  second binding.
* Every attempt has a trace id on each of its log lines and on its Event.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from scheduler.control.cache import SchedulerCache, resource_version
from scheduler.control.kubeio import BindResult, KubeWriter, PodRef
from scheduler.control.queue import (
    ClusterEvent,
    ClusterEventType,
    NodeChange,
    QueuedPodInfo,
    QueueName,
    SchedulingQueue,
    pod_key,
)
from scheduler.control.settings import SchedulerSettings
from scheduler.core.from_api import scheduled_at
from scheduler.core.load import LoadView, load_report
from scheduler.core.schedule import Framework
from scheduler.core.topology.state import TopologyState
from scheduler.model.errors import InvalidObjectError
from scheduler.model.names import CPU, MEMORY
from scheduler.model.node import Node
from scheduler.model.pod import Pod
from scheduler.model.topology import (
    NodeLoad,
    NodeTopology,
    NodeTopologyStatus,
    PressureReadings,
    TopologyParseError,
)
from scheduler.obs.logging import attempt_logger, new_trace_id
from scheduler.obs.metrics import AttemptResult, Metrics
from scheduler.predict import LoadPredictor, ObserveOutcome

Body = Mapping[str, Any]


@dataclass(frozen=True)
class BrokenPod:
    """A pending pod whose body did not parse: it waits in the queue with its error,
    so it gets a FailedScheduling event and is retried when it is updated."""

    namespace: str
    name: str
    uid: str
    error: str
    priority: int = 0
    scheduling_gates: tuple[str, ...] = ()


QueuedPod = Pod | BrokenPod


@dataclass
class Counters:
    scheduled: int = 0
    unschedulable: int = 0
    errors: int = 0
    bind_errors: int = 0


def _relevant_update(old: QueuedPod, new: QueuedPod) -> bool:
    """Status-only changes (our own condition patch) must not retrigger the pod."""
    if isinstance(old, Pod) and isinstance(new, Pod):
        masked = dataclasses.replace(
            new, phase=old.phase, nominated_node_name=old.nominated_node_name
        )
        return masked != old
    return old != new


def _node_changes(old: Node, new: Node) -> NodeChange:
    changes = NodeChange.NONE
    if old.allocatable != new.allocatable:
        changes |= NodeChange.ALLOCATABLE
    if old.labels != new.labels:
        changes |= NodeChange.LABELS
    if old.taints != new.taints:
        changes |= NodeChange.TAINTS
    if old.unschedulable != new.unschedulable:
        changes |= NodeChange.SCHEDULABLE
    return changes


class Scheduler:
    """Cache, queue and framework of one scheduler name, and its binding pool."""

    def __init__(
        self,
        settings: SchedulerSettings,
        *,
        writer: KubeWriter | None,
        metrics: Metrics,
        clock: Any = time.monotonic,
        wall_clock: Any = time.time,
    ) -> None:
        self.settings = settings
        self.framework = Framework(settings.profile)
        self.cache = SchedulerCache(topology=TopologyState(settings.profile.topology))
        self.load = LoadPredictor(settings.profile.load_aware.predict)
        """Predicted node load, fed by agents' reports and our own placements."""
        self.wall_clock = wall_clock
        """Unix time: agents date their samples with it, so report ages are measured on it."""
        self._topology_specs: dict[str, Any] = {}
        self._last_cpu: dict[str, float] = {}
        self.queue: SchedulingQueue[QueuedPod] = SchedulingQueue(
            is_relevant_update=_relevant_update
        )
        self.writer = writer
        self.metrics = metrics
        self.clock = clock
        self.counters = Counters()
        self.latencies: collections.deque[float] = collections.deque(maxlen=2000)
        """Recent queue-to-bound latencies in seconds, for the status's p50/p99."""
        self.log = structlog.get_logger("lattice.scheduler")
        self._bind_slots = asyncio.Semaphore(settings.bind_concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self._queued_rv: dict[str, int | None] = {}

    # -- settings -----------------------------------------------------------
    def apply_settings(self, settings: SchedulerSettings) -> None:
        """New profile from the next cycle on; in-flight bindings keep their slots."""
        if settings.profile != self.settings.profile:
            self.framework = Framework(settings.profile)
        if settings.profile.load_aware.predict != self.load.config:
            self.load.replace_config(settings.profile.load_aware.predict)
        if settings.bind_concurrency != self.settings.bind_concurrency:
            self._bind_slots = asyncio.Semaphore(settings.bind_concurrency)
        if self.writer is not None:
            self.writer.limiter.reconfigure(settings.client_qps, settings.client_burst)
        self.settings = settings
        self.log.info("settings_applied", reason=f"profile {settings.profile.name}")

    # -- watch side ---------------------------------------------------------
    def pod_upserted(self, body: Body) -> None:
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        key = pod_key(str(meta.get("namespace", "")), str(meta.get("name", "")))
        if spec.get("nodeName"):
            known = self.cache.cached_pod(key)
            pod = self.cache.observe_bound_pod(body)
            self._drop_from_queue(key)
            if pod is not None and known is None:
                self._note_foreign_placement(pod, str(spec["nodeName"]), body)
            if pod is not None and known is None and pod.has_pod_affinity:
                self.queue.move_all_on_event(ClusterEvent(ClusterEventType.POD_BOUND, subject=key))
            return
        if spec.get("schedulerName", "default-scheduler") != self.settings.scheduler_name:
            return
        if meta.get("deletionTimestamp") or (body.get("status") or {}).get("phase") in (
            "Succeeded",
            "Failed",
        ):
            self._drop_from_queue(key)
            return
        cached = self.cache.cached_pod(key)
        if cached is not None:
            if cached.pod.uid == str(meta.get("uid", "")):
                # We placed it already: this is an older, pending view of the same pod
                # (a re-list or a late watch event). The binding's event will follow.
                return
            self.cache.remove_pod(key)  # same name, new pod: the old one is gone
        queued: QueuedPod
        try:
            queued = Pod.from_api(body)
        except InvalidObjectError as exc:
            queued = BrokenPod(
                str(meta.get("namespace", "")),
                str(meta.get("name", "")),
                str(meta.get("uid", "")),
                str(exc),
            )
        self._queued_rv[key] = resource_version(body)
        if key in self.queue:
            self.queue.update(queued)
        else:
            self.queue.add(queued)

    def _note_foreign_placement(self, pod: Pod, node: str, body: Body) -> None:
        """A pod bound by someone else (or by us before a restart) that agents' samples may
        not show yet counts as in flight, like our own placements: another scheduler's
        burst must not make a node look idle."""
        placed = scheduled_at(body)
        if placed is None:
            return
        cfg = self.load.config
        last = self.load.sample_time(node)
        if self.wall_clock() - placed > cfg.settle_delay_s + cfg.stale_after_s:
            return  # long running: the samples show it
        if last is not None and placed < last - cfg.settle_delay_s:
            return  # the newest sample already covers it
        requests = pod.resources.requests
        self.load.note_placement(
            node,
            f"{pod.namespace}/{pod.name}",
            requests.get(CPU, 0),
            requests.get(MEMORY, 0),
            placed,
        )

    def pod_deleted(self, body: Body) -> None:
        meta = body.get("metadata") or {}
        key = pod_key(str(meta.get("namespace", "")), str(meta.get("name", "")))
        self._drop_from_queue(key)
        self.load.forget_pod(key)
        if self.cache.remove_pod(key):
            self.queue.move_all_on_event(ClusterEvent(ClusterEventType.POD_DELETED, subject=key))

    def _drop_from_queue(self, key: str) -> None:
        self._queued_rv.pop(key, None)
        info = self.queue.get(pod_key(*key.split("/", 1)))
        if info is not None:
            self.queue.delete(info.pod)

    def queued_before(self, key: str, list_rv: int | None) -> bool:
        """The queue's view of ``key`` is no newer than a list taken at ``list_rv``."""
        rv = self._queued_rv.get(key)
        return list_rv is not None and rv is not None and rv <= list_rv

    def node_upserted(self, body: Body) -> None:
        name = str((body.get("metadata") or {}).get("name", ""))
        old = self.cache.snapshot.get_node(name)
        new = self.cache.upsert_node(body)
        if new is None:
            return
        if old is None:
            self.queue.move_all_on_event(ClusterEvent(ClusterEventType.NODE_ADDED, subject=name))
            return
        changes = _node_changes(old, new)
        if changes:
            self.queue.move_all_on_event(
                ClusterEvent(ClusterEventType.NODE_CHANGED, node_changes=changes, subject=name)
            )

    def topology_upserted(self, body: Body) -> None:
        """A node agent's NodeTopology: hardware (spec) and heartbeat with load (status).

        The spec is parsed only when it changed (agents rewrite the status every report
        interval, the spec almost never); a broken status loses the load sample only.
        """
        name = str((body.get("metadata") or {}).get("name", ""))
        spec = body.get("spec") or {}
        if self._topology_specs.get(name) != spec:
            try:
                report = NodeTopology.from_spec(spec)
            except (TopologyParseError, InvalidObjectError, ValueError) as exc:
                self.log.warning("topology_unreadable", node=name, reason=str(exc))
                self._topology_specs.pop(name, None)
                self.cache.topology.remove_node_topology(name)
            else:
                self._topology_specs[name] = spec
                self.cache.topology.set_node_topology(name, report)
                self.queue.move_all_on_event(
                    ClusterEvent(ClusterEventType.NODE_TOPOLOGY_CHANGED, subject=name)
                )
        raw_status = body.get("status")
        if not raw_status:
            return
        try:
            status = NodeTopologyStatus.from_status(raw_status)
        except (TopologyParseError, ValueError) as exc:
            self.log.warning("load_report_unreadable", node=name, reason=str(exc))
            self.metrics.load_reports.labels(outcome="unreadable").inc()
            return
        if status.load is not None:
            self._observe_load(name, status.load, status.pressure)

    def _observe_load(self, node: str, load: NodeLoad, pressure: PressureReadings | None) -> None:
        before = self.load.status(node, self.wall_clock())
        outcome = self.load.observe_report(load_report(node, load, pressure), now=self.wall_clock())
        self.metrics.load_reports.labels(outcome=outcome.name.lower()).inc()
        if outcome is not ObserveOutcome.ACCEPTED:
            if outcome is not ObserveOutcome.DUPLICATE:
                self.log.warning("load_report_ignored", node=node, reason=outcome.name.lower())
            return
        # Only a load filter can have rejected a pod for load; without thresholds new
        # samples never make an unschedulable pod schedulable, so they move nothing.
        if self._load_filter_on() and (
            load.cpu_fraction < self._last_cpu.get(node, 1.0) or before.name != "FRESH"
        ):
            self.queue.move_all_on_event(
                ClusterEvent(ClusterEventType.NODE_LOAD_DECREASED, subject=node)
            )
        self._last_cpu[node] = load.cpu_fraction

    def _load_filter_on(self) -> bool:
        c = self.settings.profile.load_aware.predict
        return any(
            t is not None
            for t in (
                c.cpu_threshold,
                c.memory_threshold,
                c.cpu_pressure_threshold,
                c.memory_pressure_threshold,
            )
        )

    def topology_deleted(self, body: Body) -> None:
        name = str((body.get("metadata") or {}).get("name", ""))
        self._topology_specs.pop(name, None)
        self.cache.topology.remove_node_topology(name)
        self.load.forget_node(name)
        self._last_cpu.pop(name, None)

    def node_deleted(self, body: Body) -> None:
        name = str((body.get("metadata") or {}).get("name", ""))
        self.cache.delete_node(name)
        self.load.forget_node(name)
        self._last_cpu.pop(name, None)

    def namespace_upserted(self, body: Body) -> None:
        self.cache.upsert_namespace(body)

    def namespace_deleted(self, body: Body) -> None:
        self.cache.delete_namespace(str((body.get("metadata") or {}).get("name", "")))

    # -- scheduling side ----------------------------------------------------
    async def run(self) -> None:
        """Schedule until the queue is closed; then wait for in-flight bindings."""
        while True:
            info = await self.queue.pop()
            if info is None:
                break
            try:
                self.schedule_one(info)
            except Exception as exc:  # a bug must cost one pod a retry, not the scheduler
                self.log.exception(
                    "cycle_crashed", pod=f"{info.pod.namespace}/{info.pod.name}", reason=repr(exc)
                )
                self.queue.requeue_after_failure(info, unschedulable=False, reason=repr(exc))
            await asyncio.sleep(0)  # let watch events in between cycles

    def schedule_one(self, info: QueuedPodInfo[QueuedPod]) -> None:
        pod = info.pod
        key = f"{pod.namespace}/{pod.name}"
        trace_id = new_trace_id()
        log = attempt_logger(
            self.log,
            pod=key,
            attempt=info.attempts,  # counted at pop: 1 for the first
            cycle=self.queue.scheduling_cycle,
            trace_id=trace_id,
        )
        started = time.perf_counter()
        if isinstance(pod, BrokenPod):
            self._failed(info, log, trace_id, pod.error, started, AttemptResult.ERROR)
            return
        try:
            decision = self.framework.schedule(
                self.cache.snapshot,
                pod,
                seed=self.settings.seed,
                topology=self.cache.topology,
                load=LoadView(self.load, self.wall_clock()),
            )
        except Exception as exc:  # a bug in a plugin must not stop the scheduler
            log.exception("cycle_failed", reason=str(exc))
            self._failed(
                info, log, trace_id, f"internal error: {exc}", started, AttemptResult.ERROR
            )
            return
        if decision.selected is None:
            self._failed(
                info, log, trace_id, decision.summary, started, AttemptResult.UNSCHEDULABLE
            )
            return
        node = decision.selected
        annotations = dict(decision.annotations)
        self.cache.assume(pod, node, annotations)
        requests = pod.resources.requests
        self.load.note_placement(
            node, key, requests.get(CPU, 0), requests.get(MEMORY, 0), self.wall_clock()
        )
        elapsed = time.perf_counter() - started
        self.metrics.observe_attempt(AttemptResult.SCHEDULED, elapsed)
        log.info("pod_assumed", node=node, duration_ms=round(elapsed * 1000, 3))
        self._spawn(self._bind(info, pod, node, annotations, log, trace_id))

    def _failed(
        self,
        info: QueuedPodInfo[QueuedPod],
        log: Any,
        trace_id: str,
        message: str,
        started: float,
        result: AttemptResult,
    ) -> None:
        elapsed = time.perf_counter() - started
        self.metrics.observe_attempt(result, elapsed)
        if result is AttemptResult.UNSCHEDULABLE:
            self.counters.unschedulable += 1
        else:
            self.counters.errors += 1
        queue = self.queue.requeue_after_failure(info, unschedulable=True, reason=message)
        log.info(
            "pod_unschedulable",
            reason=message,
            queue=str(queue),
            duration_ms=round(elapsed * 1000, 3),
        )
        pod = info.pod
        if self.writer is not None:
            self._spawn(
                self._report_failure(
                    PodRef(pod.namespace, pod.name, pod.uid), message, log, trace_id
                )
            )

    async def _report_failure(self, ref: PodRef, message: str, log: Any, trace_id: str) -> None:
        assert self.writer is not None
        try:
            await self.writer.event(
                ref, reason="FailedScheduling", message=message, warning=True, trace_id=trace_id
            )
            await self.writer.mark_unschedulable(ref, message)
        except Exception as exc:  # reporting is best effort; the pod stays queued
            log.warning("report_failed", reason=str(exc))

    async def _bind(
        self,
        info: QueuedPodInfo[QueuedPod],
        pod: Pod,
        node: str,
        annotations: dict[str, str],
        log: Any,
        trace_id: str,
    ) -> None:
        assert self.writer is not None
        ref = PodRef(pod.namespace, pod.name, pod.uid)
        async with self._bind_slots:
            started = time.perf_counter()
            # Annotations on a Binding are copied onto the pod: the chosen devices travel
            # with the binding itself, so no second write can be lost in between.
            outcome = await self.writer.bind(ref, node, annotations or None)
            self.metrics.bind_duration.observe(time.perf_counter() - started)
        if outcome.result is BindResult.BOUND:
            self.cache.finish_binding(pod, self.clock())
            self.queue.done(info)
            self.counters.scheduled += 1
            latency = self.clock() - info.first_queued_at
            self.latencies.append(latency)
            self.metrics.e2e_scheduling_duration.observe(latency)
            log.info("pod_bound", node=node, duration_ms=round(latency * 1000, 3))
            try:
                await self.writer.event(
                    ref,
                    reason="Scheduled",
                    action="Binding",
                    trace_id=trace_id,
                    message=f"Successfully assigned {pod.namespace}/{pod.name} to {node}",
                )
            except Exception as exc:
                log.warning("report_failed", reason=str(exc))
            return
        self.cache.forget(pod)
        self.load.forget_pod(f"{pod.namespace}/{pod.name}")
        if outcome.result in (BindResult.BOUND_ELSEWHERE, BindResult.GONE):
            self.queue.done(info)
            log.info("binding_superseded", reason=outcome.detail)
            return
        self.counters.bind_errors += 1
        self.metrics.bind_errors.inc()
        queue = self.queue.requeue_after_failure(info, unschedulable=False, reason=outcome.detail)
        log.warning("binding_failed", node=node, reason=outcome.detail, queue=str(queue))

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, within: float) -> None:
        """Wait for in-flight bindings and reports, at most ``within`` seconds."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=within)

    # -- housekeeping -------------------------------------------------------
    def tick(self) -> None:
        """Periodic: backoff and unschedulable flushes, assumed-pod expiry, gauges."""
        self.queue.flush()
        for key in self.cache.expire(self.clock()):
            self.log.warning("assumed_pod_expired", pod=key)
        self.metrics.set_pending(self.queue.counts())
        self.metrics.set_cache_size(self.cache.snapshot.num_nodes, self.cache.lifecycle.counts())
        self.metrics.set_load_nodes(self.load_status_counts())

    def load_status_counts(self) -> dict[str, int]:
        """Cached nodes by load status (fresh/stale/unknown), for metrics and status."""
        counts = collections.Counter(
            self.load.status(name, self.wall_clock()).name.lower()
            for name in self.cache.snapshot.node_names
        )
        return dict(counts)

    def queue_counts(self) -> dict[str, int]:
        counts = self.queue.counts()
        return {str(q): counts.get(q, 0) for q in QueueName if q is not QueueName.IN_FLIGHT}

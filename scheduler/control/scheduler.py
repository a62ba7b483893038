"""The scheduler proper: watch events in, decisions out, bindings in the background.

The parts around it, each a class of its own: the intake (:mod:`~scheduler.control.intake`
streams, applied by :mod:`~scheduler.control.feed`), the binder
(:mod:`~scheduler.control.binder`), the reporter (:mod:`~scheduler.control.reporter`:
Events and PodScheduled), the gang flow (:mod:`~scheduler.control.gang_flow`: PodGroups
to joint placements, over the gang book of :mod:`~scheduler.control.gangs`), the node
reports (:mod:`~scheduler.control.node_reports`: NodeTopology and NodeResourceTopology
into devices and load), the storage (:mod:`~scheduler.control.storage`: PVs, claims,
classes into the VolumeState, and VolumeBinding's PreBind step), DynamicResources' writes
(:mod:`~scheduler.control.dra_binding`: its PreBind step, PostFilter's deallocations), the
binding cycle (:mod:`~scheduler.control.binding_cycle`: the steps run in order, undone in
reverse on any failure, the outcome settled in one place) and the preemptor
(:mod:`~scheduler.control.preemptor`: budgets, pod facts, nominations, evictions). What is
left here is the state they share (cache, queue, framework), the pod, node and budget
handlers, and the scheduling cycle of a single pod.

Theory of operation (one asyncio loop, no locks; threads only for searches that can blow
up, on immutable inputs: the gang solver and the DRA device search):

* The feed calls ``pod_upserted`` / ``pod_deleted`` / ``node_upserted`` ...
  synchronously. A bound pod (anyone's) goes to the cache; a pending pod with
  our schedulerName goes to the queue; cluster changes move waiting pods.
* ``run`` (leader only) pops a pod, runs the pure core on the cache's snapshot
  (synchronous and cheap: no awaits inside a cycle, so the snapshot cannot
  change under it), assumes the pod on the chosen node, and hands the binding
  to a bounded pool of tasks. The next cycle starts at once and already sees
  the assumed pod. A pod with DRA claims whose nodes the memo cannot answer first has
  them searched in a worker thread within its budget (:meth:`Scheduler.attempt`,
  :mod:`scheduler.core.dra.search`), the loop running meanwhile; then it is decided
  again, and that decision is the cycle above.
* A binding that fails (a PreBind step, the Bind, or an exception) undoes every step
  and the assumption and requeues with backoff; a 409 for a pod already bound is
  resolved by reading the pod, never by a second binding.
* A failed attempt's outcome picks its queue: Unschedulable (no node fits) waits in the
  unschedulable queue for a cluster event that can help; an error (a plugin bug, an
  unreadable pod) backs off with PodScheduled reason SchedulerError, since no event would
  wake it. PodScheduled is patched only when its reason or message changed; an unchanged
  FailedScheduling is sent at most once per backoff window.
* Every attempt has a trace id on each of its log lines and on its Event.
* Plugins run timed (``scheduler_plugin_execution_duration_seconds``) on one cycle in ten,
  by wrappers around the core's plugin instances (:mod:`~scheduler.control.timing`); the
  core itself never times.
* Preemption (kube's DefaultPreemption, :mod:`scheduler.core.preemption`): a pod no node
  fits, whose failure is Unschedulable somewhere, may evict lower-priority pods. The choice
  is made inside the cycle, on the same snapshot, with the PodDisruptionBudgets, pod facts
  (start times, victims terminating by preemption, ``preemptionPolicy``) and nominations
  the :class:`~scheduler.control.preemptor.Preemptor` keeps; the pod is nominated to the
  node at once (in memory) and the writes follow in a task: each victim's DisruptionTarget
  condition, its deletion and a Preempted Event, the nominations of lower-priority pods to
  that node cleared, and the preemptor's
  ``nominatedNodeName`` with its PodScheduled=False. The preemptor waits as any
  Unschedulable pod; the victims' deletions wake it. Until it binds (or is deleted, or
  nominated elsewhere), its nomination counts for pods of lower or equal priority
  (:mod:`scheduler.core.nominated`).
* Gangs (PodGroups) are one queue entry until admitted; ``run`` hands that entry to the
  gang flow, whose commit assumes all members or none and binds them through
  :meth:`Scheduler.bind`, the path single pods take. A gang member's binding outcome goes
  back to the gang flow (re-placed, or the gang made partial and ranked first).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from typing import Any, ClassVar

import structlog

from scheduler.control.binder import Binder
from scheduler.control.binding_cycle import (
    Binding,
    BindingCycle,
    Counters,
    Cycle,
    PreBindWaits,
    Step,
    nominates_before_prebind,
)
from scheduler.control.cache import SchedulerCache
from scheduler.control.dra import DraObjects
from scheduler.control.dra import Kind as DraKind
from scheduler.control.dra_binding import DraBinding
from scheduler.control.fairness import TenantRanks, weights_of
from scheduler.control.gang_flow import GangFlow
from scheduler.control.gangs import GangEntry, entry_key, gang_of
from scheduler.control.kubeio import KubeWriter, PodRef
from scheduler.control.loopwatch import busy_probe
from scheduler.control.node_reports import NodeReports
from scheduler.control.preemptor import Preemptor, ident
from scheduler.control.queue import (
    PENDING_QUEUES,
    ClusterEvent,
    ClusterEventType,
    NodeChange,
    PodKey,
    QueuedPodInfo,
    QueueName,
    SchedulingQueue,
    pod_key,
)
from scheduler.control.queued import BrokenPod, QueuedPod, relevant_update
from scheduler.control.quotas import QuotaBook
from scheduler.control.reporter import SCHEDULER_ERROR, UNSCHEDULABLE, Reporter
from scheduler.control.settings import QuotaPolicy, SchedulerSettings
from scheduler.control.storage import Kind, Storage, VolumeBinding
from scheduler.control.timing import timed
from scheduler.core.batch import Batch
from scheduler.core.dra.extended import SINCE_MINOR as DRA_EXTENDED_SINCE
from scheduler.core.dra.objects import ResourceClaim
from scheduler.core.dra.search import (
    INLINE,
    ON_LOOP_BUDGET,
    DeviceSearch,
    Job,
    feasible_to_find,
    run_jobs,
)
from scheduler.core.dra.state import ClaimPlan
from scheduler.core.explain import Decision
from scheduler.core.framework import Code
from scheduler.core.from_api import scheduled_at
from scheduler.core.gpus import Free, stranded
from scheduler.core.load import LoadView
from scheduler.core.nominated import schedule_with_nominated
from scheduler.core.plugins.dynamic_resources import (
    remember,
    stale_allocations,
    stale_extended_claim,
)
from scheduler.core.preemption import (
    TERMINATING_MESSAGE,
    Inputs,
    Preemption,
    no_preemption_message,
    preempt,
    reclaim_rules,
)
from scheduler.core.profile import DYNAMIC_RESOURCES, Profile
from scheduler.core.quota import Nominated, QuotaContext, QuotaSnapshot, add, charged
from scheduler.core.reclaim import Quotas, Reclaimed, Rules, reclaimed
from scheduler.core.schedule import Framework
from scheduler.core.topology.state import TopologyState
from scheduler.core.volumes import VolumePlan
from scheduler.model.errors import InvalidObjectError
from scheduler.model.names import CPU, MEMORY
from scheduler.model.node import Node
from scheduler.model.pod import Pod
from scheduler.obs.logging import attempt_logger, new_trace_id
from scheduler.obs.metrics import AttemptResult, Metrics, PluginTimer
from scheduler.predict import LoadPredictor

Body = Mapping[str, Any]

LOAD_GAUGE_EVERY = 4
"""Ticks between refreshes of the nodes-by-load-status gauge (ticks come 4 times a second)."""


def _yield_the_cpu() -> None:
    """The search worker's thread runs at the lowest CPU priority (Linux: a thread's own
    nice value), so where the scheduler shares cores (with the API server, on a small
    control plane) a hostile search takes what nothing else wants."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def _no_loop() -> bool:
    """The loop-has-work probe before one is known (and where none can be)."""
    return False


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
    if old.declared_features != new.declared_features:
        changes |= NodeChange.DECLARED_FEATURES
    return changes


def framework_profile(settings: SchedulerSettings) -> Profile:
    """The profile the framework runs: the settings' own, with the network levels in
    force (``spec.topology.levels``, or a Kueue Topology's as last read), which single GPU
    pods' ties read (:mod:`scheduler.core.whole_domains`)."""
    return dataclasses.replace(settings.profile, domain_levels=settings.topology.levels)


def _claim_names(pod: Pod) -> set[str]:
    """The ResourceClaims a pod's ``spec.resourceClaims`` name (kube's pod-claim index):
    written names and those generated from templates so far."""
    out = set()
    for ref in pod.resource_claims:
        claim = pod.claim_name(ref)
        if claim:
            out.add(claim)
    return out


def _needs_node_features(queued: QueuedPod) -> bool:
    """Whether a declared-features change can concern the pod (gangs: conservatively yes)."""
    return isinstance(queued, GangEntry) or (
        isinstance(queued, Pod) and bool(queued.required_features)
    )


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
        self.framework = Framework(framework_profile(settings))
        """The profile's plugins as they are (the gang solver looks them up by type)."""
        self.plugin_timer = PluginTimer(metrics.plugin_execution_duration)
        self._timed_framework = timed(self.framework, self.plugin_timer)
        """The same plugin instances, timed on sampled cycles: what scheduling cycles run."""
        self.batch = Batch()
        """Opportunistic batching (:mod:`scheduler.core.batch`): the last cycle's memo."""
        metrics.precreate_profile(settings.scheduler_name)
        self._graph_seq = 0
        self.cache = SchedulerCache(
            topology=TopologyState(settings.profile.topology),
            kube_minor=settings.profile.kube_minor,
        )
        self.cache.topology.gpu_demand.set_resources(settings.profile.gpu_placement.resources)
        self._bound_at_start: list[tuple[str, Pod]] | None = []
        """Bound pods listed before :meth:`rebuild_gpu_demand` (creationTimestamp, pod);
        None once the mix is rebuilt from them."""
        self.load = LoadPredictor(settings.profile.load_aware.predict)
        """Predicted node load, fed by agents' reports and our own placements."""
        self.wall_clock = wall_clock
        """Unix time: agents date their samples with it, so report ages are measured on it."""
        # A gang keeps its backoff: retried at once, it re-planned while its victims were
        # still terminating and evicted more (a gang e2e case, 3 runs in 5).
        self.queue: SchedulingQueue[QueuedPod] = SchedulingQueue(
            is_relevant_update=relevant_update,
            pops_early=lambda p: not isinstance(p, GangEntry),
        )
        self.tenant_ranks = TenantRanks()
        """Fair-share ranks of the quota namespaces, read by the queue under policy Fair."""
        self._quota_weights: dict[str, Fraction] = {}
        """``lattice.dev/quota-weight`` of each quota, by ``namespace/name``."""
        self._ranks_key: tuple[int, ...] | None = None
        self._ranks_at = -math.inf
        self._apply_quota_policy(settings)
        self.writer = writer
        self.metrics = metrics
        self.clock = clock
        self.counters = Counters()
        self.latencies: collections.deque[float] = collections.deque(maxlen=2000)
        """Recent queue-to-bound latencies in seconds, for the status's p50/p99."""
        self.log = structlog.get_logger("lattice.scheduler")
        self.binder: Binder | None = None
        if writer is not None:
            self.binder = Binder(
                writer, concurrency=settings.bind_concurrency, duration=metrics.bind_duration
            )
        self._ticks = 0
        self.on_expired: list[Callable[[PodKey], None]] = []
        """Told of each assumed pod whose binding never showed up in the watch (the feed
        queues it again if the pending stream still shows it)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._searches: set[asyncio.Task[None]] = set()
        """The deferred device searches among ``_tasks``: nothing is assumed before their
        decision, so a shutdown cancels them rather than waiting out their budget."""
        self._search_pool = ThreadPoolExecutor(
            1, thread_name_prefix="lattice-device-search", initializer=_yield_the_cpu
        )
        """The worker of deferred device searches (one: Python threads do not search in
        parallel, and the budget, not parallelism, bounds an attempt); its thread starts
        on first use."""
        self._search_slot = asyncio.Semaphore(1)
        self._in_cycle = False
        self._loop_has_work: Callable[[], bool] = _no_loop
        """Held by the one attempt whose search the worker runs; others wait for it (FIFO),
        and their budgets start when they get it."""
        self.reporter: Reporter | None = None
        """Events and PodScheduled, through one bounded queue (None: nothing is written)."""
        if writer is not None:
            self.reporter = Reporter(
                writer,
                spawn=self._spawn,
                clock=clock,
                repeat_after=self.queue.config.max_backoff,
                on_drop=metrics.reports_dropped.inc,
            )
        self.preemptor = Preemptor(
            writer=writer,
            reporter=self.reporter,
            scheduler_name=lambda: self.settings.scheduler_name,
            log=self.log,
        )
        """Budgets, pod facts and nominations preemption reads, and its eviction writes."""
        self.node_reports = NodeReports(
            topology=self.cache.topology,
            load=self.load,
            queue=self.queue,
            metrics=metrics,
            settings=lambda: self.settings,
            wall_clock=wall_clock,
            log=self.log,
        )
        """NodeTopology and NodeResourceTopology reports: devices and load."""
        self.storage = Storage(self.cache.volumes, log=self.log)
        """PVs, claims, StorageClasses, CSINodes, VolumeAttachments, CSIDrivers,
        CSIStorageCapacities, and the PreBind waits."""
        self.dra = DraObjects(self.cache.dra, log=self.log)
        """DeviceClasses, ResourceClaims, ResourceSlices: what DynamicResources reads."""
        self.quotas = QuotaBook()
        """ElasticQuotas (CapacityScheduling's admission); usage is the cache's."""
        self.prebind_waits = PreBindWaits()
        """Pods waiting in a PreBind (volumes bound, binding conditions met): a deletion
        ends the wait."""
        self.dra_binding = DraBinding(
            objects=self.dra,
            writer=writer,
            queue=self.queue,
            reporter=self.reporter,
            metrics=metrics,
            waits=self.prebind_waits,
            claim_written=self._claim_written,
            settings=lambda: self.settings,
            wall_clock=wall_clock,
        )
        """DynamicResources' writes: its binding-cycle step, PostFilter's deallocations."""
        self.gang_flow = GangFlow(
            self,
            cache=self.cache,
            queue=self.queue,
            load=self.load,
            metrics=metrics,
            reporter=self.reporter,
            writer=writer,
            clock=clock,
            wall_clock=wall_clock,
            spawn=self._spawn,
            log=self.log,
        )
        """PodGroups and their members, to one joint placement per gang."""
        self.binding_cycle = BindingCycle(
            cache=self.cache,
            load=self.load,
            queue=self.queue,
            gang_flow=self.gang_flow,
            preemptor=self.preemptor,
            binder=self.binder,
            writer=writer,
            reporter=self.reporter,
            metrics=metrics,
            counters=self.counters,
            latencies=self.latencies,
            settings=lambda: self.settings,
            clock=clock,
            spawn=self._spawn,
            forget_reports=self.forget_reports,
        )
        """Reserve's sequel for every pod: PreBind steps, Bind, one unwinding and settling."""

    @property
    def event_repeat_after(self) -> float:
        """Seconds before an unchanged FailedScheduling is sent again: one per backoff window."""
        return self.reporter.repeat_after if self.reporter else self.queue.config.max_backoff

    # -- settings -----------------------------------------------------------
    def apply_settings(self, settings: SchedulerSettings) -> None:
        """New profile from the next cycle on; in-flight bindings keep their slots."""
        self.batch.clear()
        if framework_profile(settings) != self.framework.profile:
            self.framework = Framework(framework_profile(settings))
            self._timed_framework = timed(self.framework, self.plugin_timer)
        if settings.scheduler_name != self.settings.scheduler_name:
            self.metrics.precreate_profile(settings.scheduler_name)
        if settings.profile.gpu_placement.resources != self.cache.topology.gpu_demand.resources:
            self.cache.topology.gpu_demand.set_resources(settings.profile.gpu_placement.resources)
        if settings.profile.load_aware.predict != self.load.config:
            self.load.replace_config(settings.profile.load_aware.predict)
        if self.binder is not None:
            self.binder.resize(settings.bind_concurrency)
        if self.writer is not None:
            self.writer.reconfigure(settings.client_qps, settings.client_burst)
        self._apply_quota_policy(settings)
        changed = settings.profile != self.settings.profile
        levels_changed = settings.topology.levels != self.settings.topology.levels
        self.settings = settings
        if levels_changed:
            self.gang_flow.levels_changed()
        self.log.info("settings_applied", reason=f"profile {settings.profile.name}")
        if changed:
            self.queue.move_all_on_event(
                ClusterEvent(ClusterEventType.PROFILE_CHANGED, subject=settings.profile.name)
            )

    def _apply_quota_policy(self, settings: SchedulerSettings) -> None:
        """Fair: equal priorities ordered by tenant rank; Capacity: arrival order."""
        fair = settings.quota.policy is QuotaPolicy.FAIR
        self.queue.set_tenant_rank(self.tenant_ranks.rank if fair else None)

    # -- watch side ---------------------------------------------------------
    def pod_upserted(self, body: Body) -> None:
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        key = pod_key(str(meta.get("namespace", "")), str(meta.get("name", "")))
        gang = gang_of(body)
        if spec.get("nodeName"):
            self.forget_reports(str(meta.get("uid", "")))
            self.preemptor.pod_bound(ident(body))
            self.preemptor.note_facts(ident(body), body)
            known = self.cache.cached_pod(key)
            pod = self.cache.observe_bound_pod(body)
            self._drop_from_queue(key)
            if gang is not None:
                self.gang_flow.member_bound(gang, key, body)
            if pod is not None and known is None:
                self._note_foreign_placement(pod, str(spec["nodeName"]), body)
                if self._bound_at_start is not None:
                    self._bound_at_start.append((str(meta.get("creationTimestamp", "")), pod))
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
            self.forget_reports(str(meta.get("uid", "")))
            self._pending_gone(ident(body), key)
            if gang is not None:
                self.gang_flow.member_gone(gang, key)
            return
        self._note_condition(str(meta.get("uid", "")), body)
        self.preemptor.note_facts(ident(body), body)
        cached = self.cache.cached_pod(key)
        if cached is not None:
            if cached.pod.uid == str(meta.get("uid", "")):
                # We placed it already: this is an older, pending view of the same pod
                # (a re-list or a late watch event). The binding's event will follow.
                return
            self.cache.remove_pod(key)  # same name, new pod: the old one is gone
        queued: QueuedPod
        try:
            queued = Pod.from_api(body, kube_minor=self.settings.profile.kube_minor)
        except InvalidObjectError as exc:
            queued = BrokenPod(
                str(meta.get("namespace", "")),
                str(meta.get("name", "")),
                str(meta.get("uid", "")),
                str(exc),
            )
        if isinstance(queued, Pod):
            self.preemptor.note_nomination(queued)
            self.cache.topology.gpu_demand.set_pending(key, queued)
        if gang is not None:
            self.gang_flow.member_pending(gang, key, queued)
            return
        if key in self.queue:
            self.queue.update(queued)
        else:
            self.queue.add(queued)

    def rebuild_gpu_demand(self) -> int:
        """The bound pods are listed: the GPU request mix learns them as arrivals in
        creation order, as ``lattice explain`` does (one call,
        :meth:`~scheduler.core.gpus.GpuDemand.observe_placed`), so a restart or a failover
        does not judge from the 1/2/4/8 prior. Pods deleted while the list was read are left
        out. Returns the GPU pods observed; later calls do nothing."""
        bound, self._bound_at_start = self._bound_at_start, None
        if not bound:
            return 0
        live = [
            (created, pod)
            for created, pod in bound
            if (cached := self.cache.cached_pod(pod_key(pod.namespace, pod.name))) is not None
            and cached.pod.uid == pod.uid
        ]
        return self.cache.topology.gpu_demand.observe_placed(live)

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

    def nominated(self) -> list[tuple[Pod, str]]:
        return self.preemptor.nominated()

    def _note_condition(self, uid: str, body: Body) -> None:
        if self.reporter is not None:
            self.reporter.note_condition(uid, body.get("status") or {})

    def pod_deleted(self, body: Body) -> None:
        """The pod is gone (or finished). By uid: a pod re-created under the same name may
        already be queued or placed when the old one's DELETED arrives."""
        meta = body.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        self.forget_reports(uid)
        key = pod_key(str(meta.get("namespace", "")), str(meta.get("name", "")))
        info = self.queue.get(key)
        if info is not None and (not uid or info.pod.uid == uid):
            self._drop_from_queue(key)
        self.cache.topology.gpu_demand.set_pending(key, None)  # a gang member, too
        self._pending_gone(ident(body), key)
        cached = self.cache.cached_pod(key)
        removed = False
        if cached is not None and (not uid or cached.pod.uid == uid):
            self.load.forget_pod(key)
            removed = self.cache.remove_pod(key)
        gang = gang_of(body)
        if gang is not None:
            self.gang_flow.member_gone(gang, key)
        if removed:
            self.queue.move_all_on_event(ClusterEvent(ClusterEventType.POD_DELETED, subject=key))

    def binding_confirmed(self, body: Body, key: PodKey, rv: int | None) -> None:
        """The watch shows our binding exactly as assumed (the feed compared fingerprints):
        what :meth:`pod_upserted` does for a bound pod, without re-placing it."""
        meta = body.get("metadata") or {}
        self.forget_reports(str(meta.get("uid", "")))
        self.preemptor.pod_bound(ident(body))
        self.preemptor.note_facts(ident(body), body)
        self.cache.confirm(key, rv, meta.get("generation"))
        self._drop_from_queue(key)
        gang = gang_of(body)
        if gang is not None:
            self.gang_flow.member_bound(gang, key, body)

    def bound_pod_unchanged(self, body: Body, key: PodKey, rv: int | None) -> None:
        """A bound pod changed only where scheduling does not read (status, mostly): its
        facts (it started) may have changed."""
        self.cache.touch(key, rv)
        self.preemptor.note_facts(ident(body), body)
        gang = gang_of(body)
        if gang is not None:
            self.gang_flow.member_bound(gang, key, body)  # counts Running members

    def pending_left(self, body: Body, *, bound: bool) -> None:
        """The pending stream no longer shows the pod: bound (``bound``: by us, or seen on a
        node) or deleted. Only the queue and the gang's waiting members change here; the
        snapshot follows the assigned stream."""
        meta = body.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        key = pod_key(str(meta.get("namespace", "")), str(meta.get("name", "")))
        info = self.queue.get(key)
        if info is not None and info.pod.uid == uid:
            self._drop_from_queue(key)
        self.cache.topology.gpu_demand.set_pending(key, None)
        if bound:
            self.preemptor.pod_bound(ident(body))
            return
        self.prebind_waits.gone(uid)
        self._pending_gone(ident(body), key)
        self.forget_reports(uid)
        gang = gang_of(body)
        if gang is not None:
            member = (g := self.gang_flow.gangs.get(gang)) and g.pending.get(key)
            if member and member.uid == uid:
                self.gang_flow.member_gone(gang, key)

    def pending_relisted(self, live: set[str]) -> None:
        """The pending stream's whole set (by uid) after a re-list: queued pods and waiting
        gang members not in it were bound or deleted during the gap."""
        for name in PENDING_QUEUES:
            for queued in self.queue.pods(name):
                if isinstance(queued, GangEntry):
                    continue  # kept in step with its members
                if queued.uid not in live:
                    self.queue.delete(queued)
                    self.cache.topology.gpu_demand.set_pending(
                        pod_key(queued.namespace, queued.name), None
                    )
                    self.forget_reports(queued.uid)
                    self._pending_gone(
                        queued.uid or f"{queued.namespace}/{queued.name}",
                        pod_key(queued.namespace, queued.name),
                    )
        for gang in list(self.gang_flow.gangs):
            gone = [k for k, m in gang.pending.items() if m.uid not in live]
            for key in gone:
                self.gang_flow.member_gone(gang.key, key)

    def _pending_gone(self, ident_key: str, key: PodKey) -> None:
        """A pod of ours deleted (or finished) before it was placed: its facts and its
        nomination are forgotten. The nomination kept pods of lower or equal priority off
        its node; they are retried now, as kube-scheduler moves them (an AssignedPodDelete
        for those priorities) when a nominated pod is deleted, not at the unschedulable
        pool's flush minutes later."""
        ended = self.preemptor.nominations.get(ident_key)
        self.preemptor.forget_pod(ident_key)
        if ended is None:
            return
        priority = ended[0].priority
        self.queue.move_all_on_event(
            ClusterEvent(ClusterEventType.POD_DELETED, subject=key),
            pre_check=lambda queued: queued.priority <= priority,
        )

    def _drop_from_queue(self, key: str) -> None:
        self.cache.topology.gpu_demand.set_pending(key, None)
        info = self.queue.get(pod_key(*key.split("/", 1)))
        if info is not None:
            self.queue.delete(info.pod)

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
            # A change of declared features alone helps only pods that need one, as in kube
            # only NodeDeclaredFeatures registers for it.
            only_features = changes == NodeChange.DECLARED_FEATURES
            self.queue.move_all_on_event(
                ClusterEvent(ClusterEventType.NODE_CHANGED, node_changes=changes, subject=name),
                _needs_node_features if only_features else None,
            )

    def node_deleted(self, body: Body) -> None:
        name = str((body.get("metadata") or {}).get("name", ""))
        self.cache.delete_node(name)
        self.node_reports.node_gone(name)

    def namespace_upserted(self, body: Body) -> None:
        self.cache.upsert_namespace(body)

    def namespace_deleted(self, body: Body) -> None:
        self.cache.delete_namespace(str((body.get("metadata") or {}).get("name", "")))

    # PodGroups reach the feed's handlers here like every other kind; the gang flow owns them.
    def storage_upserted(self, kind: Kind, body: Body) -> None:
        self.storage.upsert(kind, body)
        self._storage_changed(kind, body)

    def storage_deleted(self, kind: Kind, body: Body) -> None:
        self.storage.delete(kind, body)
        self._storage_changed(kind, body)

    def _storage_changed(self, kind: Kind, body: Body) -> None:
        """Only pods with claims or inline disks can be helped by a storage change (kube
        registers VolumeBinding, VolumeZone, VolumeRestrictions and NodeVolumeLimits for
        them; a CSINode's limits also bound inline disks)."""
        name = (body.get("metadata") or {}).get("name", "")
        self.queue.move_all_on_event(
            ClusterEvent(ClusterEventType.STORAGE_CHANGED, subject=f"{kind}/{name}"),
            lambda p: isinstance(p, GangEntry) or (isinstance(p, Pod) and bool(p.storage_volumes)),
        )

    def dra_upserted(self, kind: DraKind, body: Body) -> None:
        old = self._held_claim(kind, body)
        self.dra.upsert(kind, body)
        if kind is DraKind.CLAIM:
            meta = body.get("metadata") or {}
            key = (str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
            shared = self.cache.dra.shared_devices(key)
            if shared:  # the API server does not stop it: two schedulers, one pool
                devices = ", ".join("/".join(d) for d in shared)
                self.metrics.dra_double_allocations.inc()
                self.log.warning(
                    "device_double_allocated", pod=f"{key[0]}/{key[1]}", reason=devices
                )
                if self.reporter is not None:
                    self.reporter.event(
                        PodRef(key[0], key[1], str(meta.get("uid") or "")),
                        reason="DeviceDoubleAllocated",
                        message=(
                            f"device(s) {devices} are also in another claim's allocation: two "
                            "schedulers allocated one pool (give Lattice its own nodes with "
                            "LatticeScheduler spec.dra.nodeSelector)"
                        ),
                        warning=True,
                        action="Allocating",
                        kind="ResourceClaim",
                        api_version="resource.k8s.io/v1",
                    )
        self._dra_changed(kind, body, old, deleted=False)

    def dra_deleted(self, kind: DraKind, body: Body) -> None:
        old = self._held_claim(kind, body)
        self.dra.delete(kind, body)
        self._dra_changed(kind, body, old, deleted=True)

    def _claim_written(self, body: Body) -> None:
        """A claim as our own write returned it: applied at once (newer than the watch's),
        and it wakes the pods it can help here, since its echo will show no change."""
        old = self._held_claim(DraKind.CLAIM, body)
        self.dra.claim_written(body)
        self._dra_changed(DraKind.CLAIM, body, old, deleted=False)

    def _held_claim(self, kind: DraKind, body: Body) -> ResourceClaim | None:
        if kind is not DraKind.CLAIM:
            return None
        meta = body.get("metadata") or {}
        return self.cache.dra.claims.get(
            (str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
        )

    def _dra_changed(
        self, kind: DraKind, body: Body, old: ResourceClaim | None, *, deleted: bool
    ) -> None:
        """Wake the pods a DRA object's change can help, by kube's queueing hints: a
        claim deallocated, or deleted while allocated, frees devices for every pod with
        claims; any other claim change only the pods that use that claim, and only when it
        was created or its status changed; a ResourceSlice or DeviceClass added or updated
        (not deleted) every pod with claims. Device taint rules wake every pod with claims
        either way (a rule lifted frees devices)."""
        meta = body.get("metadata") or {}
        name = str(meta.get("name") or "")
        event = ClusterEvent(ClusterEventType.DRA_CHANGED, subject=f"{kind}/{name}")
        if kind is DraKind.CLAIM:
            namespace = str(meta.get("namespace") or "default")
            new = None if deleted else self.cache.dra.claims.get((namespace, name))
            freed = (
                old is not None
                and old.allocation is not None
                and (new is None or new.allocation is None)
            )
            if not freed:
                if new is None or (
                    old is not None
                    and old.allocation == new.allocation
                    and old.reserved_for == new.reserved_for
                ):
                    return  # an unallocated claim gone, or nothing a pod waits for changed
                self.queue.move_all_on_event(
                    event,
                    lambda p: (
                        isinstance(p, Pod) and p.namespace == namespace and name in _claim_names(p)
                    ),
                )
                return
        elif deleted and kind in (DraKind.SLICE, DraKind.CLASS):
            return  # devices or classes gone help no pod
        self.queue.move_all_on_event(
            event,
            lambda p: isinstance(p, Pod) and bool(p.resource_claims or p.container_requests),
        )

    def podgroup_upserted(self, body: Body, *, upstream: bool = False) -> None:
        """A PodGroup: scheduler-plugins', or with ``upstream`` Kubernetes' own."""
        self.gang_flow.podgroup_upserted(body, upstream=upstream)

    def podgroup_deleted(self, body: Body, *, upstream: bool = False) -> None:
        self.gang_flow.podgroup_deleted(body, upstream=upstream)

    def podgroup_keys(self, *, upstream: bool = False) -> set[str]:
        """Gangs with a PodGroup of that API (a re-list reconciles them)."""
        return self.gang_flow.podgroup_keys(upstream=upstream)

    def quota_upserted(self, body: Body) -> None:
        before = self.quotas.namespaces()
        self._note_weight(body)
        if self.quotas.upserted(body):
            self._quota_changed(before, body)

    def quota_deleted(self, body: Body) -> None:
        before = self.quotas.namespaces()
        meta = body.get("metadata") or {}
        self._quota_weights.pop(f"{meta.get('namespace', '')}/{meta.get('name', '')}", None)
        if self.quotas.deleted(body):
            self._quota_changed(before, body)

    def _note_weight(self, body: Body) -> None:
        """The quota's fair-share weight; a bad annotation weighs 1 and is logged."""
        meta = body.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        weights, errors = weights_of([body])
        weight = next(iter(weights.values()), Fraction(1))
        for error in errors.values():
            self.log.warning("quota_weight_invalid", quota=key, reason=error)
        if self._quota_weights.get(key) != weight:
            self._quota_weights[key] = weight
            self._ranks_key = None

    RANKS_EVERY: ClassVar[float] = 0.1
    """Seconds between two recomputations of the tenant ranks while the cluster changes
    (every cycle changes it): a rank a few cycles old orders the queue just as well."""

    def refresh_tenant_ranks(self) -> None:
        """Recompute the fair-share ranks the queue orders by (policy Fair, quotas present)
        when usage, quotas or the queue changed, at most every :attr:`RANKS_EVERY` s.
        Demand is use plus the requests of the namespace's waiting pods (gangs' members
        are not counted until they are bound)."""
        if self.settings.quota.policy is not QuotaPolicy.FAIR or not len(self.quotas):
            return
        key = (self.cache.snapshot.generation, len(self.queue))
        now = self.clock()
        if key == self._ranks_key or now - self._ranks_at < self.RANKS_EVERY:
            return
        self._ranks_key, self._ranks_at = key, now
        quotas = self.quota_snapshot()
        pending: dict[str, dict[str, int]] = {}
        for queue_name in (QueueName.ACTIVE, QueueName.BACKOFF, QueueName.UNSCHEDULABLE):
            for pod in self.queue.pods(queue_name):
                if isinstance(pod, Pod) and pod.namespace in quotas.quotas:
                    pending[pod.namespace] = add(
                        pending.get(pod.namespace, {}), charged(pod, self.cache.dra)
                    )
        snap = self.cache.snapshot
        totals = snap.allocatable.sum(axis=1)
        capacity = {r: int(v) for r, v in zip(snap.resource_names, totals, strict=True)}
        weights = {
            ns: self._quota_weights.get(f"{ns}/{q.name}", Fraction(1))
            for ns, q in quotas.quotas.items()
        }
        self.tenant_ranks.refresh(quotas, weights, capacity, pending)

    def _quota_changed(self, before: frozenset[str], body: Body) -> None:
        """A quota's spec changed, or it came or went: the sum of mins moved too, so every
        waiting pod of a namespace with a quota (then or now) may be admitted now."""
        self._ranks_key = None  # the fair shares moved with the quotas
        meta = body.get("metadata") or {}
        governed = before | self.quotas.namespaces()
        self.queue.move_all_on_event(
            ClusterEvent(
                ClusterEventType.QUOTA_CHANGED,
                subject=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
            ),
            lambda p: p.namespace in governed,
        )

    def quota_snapshot(self) -> QuotaSnapshot:
        """The quotas with their namespaces' usage now (bound and assumed pods)."""
        return self.quotas.snapshot(self.cache.quota_usage, self.cache.dra)

    def quota_context(
        self, *, exclude: frozenset[str] = frozenset(), namespace: str | None = None
    ) -> QuotaContext | None:
        """What CapacityScheduling reads in a cycle; None without quotas, or when
        ``namespace`` (the pod's) has none: the plugin then skips the pod. Nominated pods
        of quota namespaces hold their quota room, except those keyed in ``exclude`` (a
        gang's own members)."""
        if not len(self.quotas) or (
            namespace is not None and namespace not in self.quotas.namespaces()
        ):
            return None
        snapshot = self.quota_snapshot()
        fair = (
            self.tenant_ranks.shares() if self.settings.quota.policy is QuotaPolicy.FAIR else None
        )
        shares, capacity = (None, None) if fair is None else fair
        nominated = tuple(
            (
                p.uid,
                Nominated.of(
                    snapshot, p.namespace, p.priority, charged(p, self.cache.dra), shares, capacity
                ),
            )
            for p, _ in (self.nominated() if self.preemptor.nominations else ())
            if snapshot.governs(p.namespace) and p.key not in exclude
        )
        return QuotaContext(snapshot, nominated)

    # -- scheduling side ----------------------------------------------------
    async def open_connections(self) -> int:
        """As many connections as bindings and reports can have in flight, opened before
        the first cycle (how many opened; 0 without a writer): a new leader's first burst
        does not pay their TLS handshakes while it schedules."""
        if self.writer is None or self.binder is None:
            return 0
        wanted = self.binder.concurrency + (self.reporter.in_flight if self.reporter else 0)
        return await self.writer.open_connections(wanted)

    async def run(self) -> None:
        """Schedule until the queue is closed; then wait for in-flight bindings."""
        while True:
            self.refresh_tenant_ranks()
            info = await self.queue.pop()
            if info is None:
                break
            self._in_cycle = True
            try:
                if isinstance(info.pod, GangEntry):
                    self.gang_flow.schedule(info)
                else:
                    await self.attempt(info)
            except Exception as exc:  # a bug must cost one pod a retry, not the scheduler
                self.log.exception(
                    "cycle_crashed", pod=f"{info.pod.namespace}/{info.pod.name}", reason=repr(exc)
                )
                self.queue.requeue_after_failure(info, unschedulable=False, reason=repr(exc))
            finally:
                self._in_cycle = False
            await asyncio.sleep(0)  # let watch events in between cycles

    async def attempt(self, info: QueuedPodInfo[QueuedPod]) -> None:
        """One pod's attempt. A pod with DRA claims is decided with a deferred device
        search: when the memo answers every node, that decision is acted on at once, as
        any pod's. When it leaves nodes to search, the attempt goes on in a task of its
        own (:meth:`_search_then_decide`) and the loop goes on scheduling other pods
        meanwhile (:mod:`scheduler.core.dra.search` says why the search, not the whole
        decision, leaves the loop)."""
        pod = info.pod
        if not isinstance(pod, Pod) or not (pod.resource_claims or pod.container_requests):
            self.schedule_one(info)
            return
        started = time.perf_counter()
        if self.schedule_one(info, search=self._device_search(), started=started):
            task = self._track(self._search_then_decide(info, started))
            self._searches.add(task)
            task.add_done_callback(self._searches.discard)

    def _device_search(self) -> DeviceSearch:
        if self._loop_has_work is _no_loop:
            with contextlib.suppress(RuntimeError):  # no running loop: a test's direct call
                self._loop_has_work = busy_probe(asyncio.get_running_loop())
        return DeviceSearch(
            self.settings.profile.dynamic_resources.search_budget,
            deferred=True,
            inline=INLINE,
            enough=self._feasible_to_find(),
            loop_busy=self._loop_busy,
        )

    def _loop_busy(self) -> bool:
        """The loop has work (out of ``select()``: watch events, bindings), a cycle is
        running or pods wait in the active queue: the worker's search then pauses longer
        (:data:`~scheduler.core.dra.search.BUSY_PAUSE`). Called from the worker thread:
        it only reads flags and a length."""
        return self._in_cycle or self.queue.count(QueueName.ACTIVE) > 0 or self._loop_has_work()

    async def _search_then_decide(self, info: QueuedPodInfo[QueuedPod], started: float) -> None:
        """The rest of a DRA pod's attempt: once the worker is free (one search at a time),
        decide again on the snapshot as it is then, with the budget starting now; hand
        the nodes it leaves to the worker, write their verdicts into the memo, and decide
        again, until a decision leaves nothing to search (or finds the budget spent). That
        decision is acted on with no await between it and the assumption. The worker
        reads only immutable inputs, so watch events, bindings and other pods' cycles go
        on meanwhile; a class, slice or taint rule changed meanwhile drops its verdicts
        (:attr:`~scheduler.core.dra.state.DraState.generation`)."""
        pod = info.pod
        key = f"{pod.namespace}/{pod.name}"
        dra = self.cache.dra
        loop = asyncio.get_running_loop()
        async with self._search_slot:
            search = self._device_search()
            try:
                while self.queue.in_flight(info):
                    jobs = self.schedule_one(info, search=search, started=started)
                    if not jobs:
                        return
                    generation = dra.generation
                    try:
                        await loop.run_in_executor(
                            self._search_pool, run_jobs, search, jobs, search.enough
                        )
                    except asyncio.CancelledError:
                        search.abandon()
                        raise
                    if dra.generation != generation:
                        search.outcomes.clear()
                        continue
                    for job in jobs:
                        outcome = search.outcomes.get(job.key)
                        if outcome is not None:
                            remember(dra, job.key, outcome)
            except Exception as exc:  # a bug must cost one pod a retry, not the scheduler
                self.log.exception("cycle_crashed", pod=key, reason=repr(exc))
                self.queue.requeue_after_failure(info, unschedulable=False, reason=repr(exc))
                return
        self.log.info("attempt_dropped", pod=key, reason="the pod left the queue during its search")

    def _feasible_to_find(self) -> int | None:
        """kube's stop for the device search where ``percentageOfNodesToScore`` is set;
        unset (0), Lattice searches every node within the budget, as it filters every
        node (:mod:`scheduler.core.schedule`)."""
        percentage = self.settings.percentage_of_nodes_to_score
        if percentage <= 0:
            return None
        return feasible_to_find(self.cache.snapshot.num_nodes, percentage)

    def decide(
        self,
        pod: Pod,
        *,
        restrict_to: frozenset[str] | None = None,
        ignore_nominated: frozenset[str] = frozenset(),
        search: DeviceSearch | None = None,
    ) -> Decision:
        """``pod`` on the snapshot as it is now, plugins timed on sampled cycles: a single
        pod's cycle, and a gang member re-checked against its plan (``restrict_to``).
        Nominated pods of at least its priority hold their nodes' room
        (:func:`~scheduler.core.nominated.schedule_with_nominated`), except those keyed in
        ``ignore_nominated`` (a gang's own members, whose plan replaces their nominations)."""
        nominated = self.nominated() if self.preemptor.nominations else []
        if self.plugin_timer.on:
            self.batch.clear()  # a sampled cycle times every plugin: the full cycle
        if ignore_nominated:
            nominated = [(p, n) for p, n in nominated if p.key not in ignore_nominated]
        return schedule_with_nominated(
            # The same plugin instances either way; the wrappers only on sampled cycles,
            # since even switched off they cost a call per plugin and extension point.
            self._timed_framework if self.plugin_timer.on else self.framework,
            self.cache.snapshot,
            pod,
            nominated,
            seed=self.settings.seed,
            topology=self.cache.topology,
            load=LoadView(self.load, self.wall_clock()),
            restrict_to=restrict_to,
            volumes=self.cache.volumes,
            dra=self.cache.dra,
            batch=self.batch if restrict_to is None else None,
            search=search,
            quota=(
                self.quota_context(exclude=ignore_nominated, namespace=pod.namespace)
                if restrict_to is None
                else None
            ),
        )

    def preemption_inputs(self) -> Inputs:
        """What :func:`~scheduler.core.preemption.preempt` reads beside snapshot and pod;
        placed gang members are evicted whole (the gang flow knows them)."""
        gangs, gang_members = self.gang_flow.placed_members()
        return Inputs(
            pdbs=tuple(self.preemptor.pdbs.values()),
            nominated=self.nominated(),
            facts=self.preemptor.facts,
            seed=self.settings.seed,
            topology=self.cache.topology,
            load=LoadView(self.load, self.wall_clock()),
            gangs=gangs,
            gang_members=gang_members,
            volumes=self.cache.volumes,
            dra=self.cache.dra,
            search=DeviceSearch(
                min(self.settings.profile.dynamic_resources.search_budget, ON_LOOP_BUDGET)
            ),
            quotas=self.reclaim_quotas(),
        )

    def reclaim_quotas(self) -> Quotas | None:
        """The ElasticQuotas as preemption reads them (None without any: kube's rules): the
        usage now, pods charged as CapacityScheduling charges them (DRA devices included);
        under ``spec.quota.policy: Fair``, the fair shares of the tenant ranks' last refresh
        (none yet: CapacityScheduling's rules alone)."""
        if not len(self.quotas):
            return None
        dra = self.cache.dra
        shares = (
            self.tenant_ranks.shares() if self.settings.quota.policy is QuotaPolicy.FAIR else None
        )
        return Quotas(
            self.quota_snapshot(),
            held=lambda p: charged(p, dra, bound=True),
            asked=lambda p: charged(p, dra),
            fair_share=None if shares is None else shares[0],
            capacity={} if shares is None else shares[1],
        )

    def _post_filter(
        self, decision: Decision, log: Any
    ) -> tuple[Preemption | None, str, Rules | None]:
        """kube's PostFilter after a failed cycle: a preemption, or why none (kube's
        ``preemption: ...`` text, to append to the FailedScheduling message); and, for a
        preemption, the reclaim rules it applied (reclaimed victims are announced as such,
        with the rule that took them)."""
        pod = decision.pod
        nominated = self.preemptor.nominations.get(pod.key)
        if nominated is not None and pod.nominated_node_name != nominated[1]:
            # Our own nomination, which the pod's record (parsed before it) cannot show.
            pod = dataclasses.replace(pod, nominated_node_name=nominated[1])
            decision = dataclasses.replace(decision, pod=pod)
        if self.preemptor.still_evicting(pod.key):
            # Its victims are still in the cache: preempting again would take more pods.
            return None, TERMINATING_MESSAGE, None
        if self.preemptor.releasing_devices(pod.key, self._holds_devices):
            # Its victims went but their claims are not yet deallocated (Lattice beyond
            # kube 1.37, whose retry here clears the nomination and frees the devices for
            # any pod): it keeps its nomination, and with it the devices' hold.
            return None, TERMINATING_MESSAGE, None
        inputs = self.preemption_inputs()
        snapshot = self.cache.snapshot
        self.metrics.preemption_attempts.inc()  # as kube: every PostFilter run
        try:
            found = preempt(self.framework, snapshot, decision, inputs)
            if found is not None:
                return found, "", reclaim_rules(decision.pod, inputs)
            why = no_preemption_message(self.framework, snapshot, decision, inputs)
            return None, why, None
        except Exception as exc:  # a bug in preemption costs the pod its preemption only
            log.exception("preemption_failed", reason=repr(exc))
            return None, f"internal error: {exc}", None

    def _holds_devices(self, pod_key: str) -> bool:
        """Some allocated claim is still reserved for the pod, or generated for it."""
        return any(
            claim.allocation is not None
            and (
                claim.controller_uid == pod_key or any(r.uid == pod_key for r in claim.reserved_for)
            )
            for claim in self.cache.dra.claims.values()
        )

    def schedule_one(
        self,
        info: QueuedPodInfo[QueuedPod],
        *,
        search: DeviceSearch | None = None,
        started: float | None = None,
    ) -> list[Job]:
        """One decision for the pod, acted on; or, with a deferred ``search`` that left
        nodes to search, nothing done and those nodes returned (:meth:`attempt`).
        ``started``: when the attempt began (the first of its decisions)."""
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
        if started is None:
            started = time.perf_counter()
        if isinstance(pod, BrokenPod):
            self._failed(info, log, trace_id, pod.error, started, AttemptResult.ERROR)
            return []
        assert isinstance(pod, Pod)
        self.plugin_timer.start_cycle(self.queue.scheduling_cycle)
        dra = self.cache.dra
        uses_dra = pod.resource_claims or pod.container_requests
        before = (dra.stats.seconds, dra.compiler.evaluations) if uses_dra else None
        hits = self.batch.hits
        try:
            decision = self.decide(pod, search=search)
        except Exception as exc:  # a bug in a plugin must not stop the scheduler
            log.exception("cycle_failed", reason=str(exc))
            self._failed(
                info, log, trace_id, f"internal error: {exc}", started, AttemptResult.ERROR
            )
            return []
        if self.batch.hits != hits:
            self.metrics.batched_cycles.inc()
        if search is not None:
            jobs = search.take_jobs()
            if jobs and decision.code is not Code.ERROR:  # an error ends it as in kube
                return jobs
        if before is not None:
            worker = search.seconds if search is not None else 0.0
            self.metrics.dra_allocation_duration.observe(dra.stats.seconds - before[0] + worker)
            self.metrics.dra_cel_evaluations.observe(dra.compiler.evaluations - before[1])
        if decision.selected is None:
            if decision.code is Code.ERROR:  # an allocator error: backoff, no preemption
                self._failed(info, log, trace_id, decision.summary, started, AttemptResult.ERROR)
                return []
            if decision.explanation.gated_message is not None:
                self._failed(
                    info, log, trace_id, decision.summary, started, AttemptResult.UNSCHEDULABLE
                )
                return []
            if pod.resource_claims:
                reached = decision.explanation.reached(DYNAMIC_RESOURCES)
                stale = stale_allocations(
                    pod,
                    self.cache.dra,
                    self.cache.snapshot,
                    reached,
                    binding_timeout=self.dra_binding.binding_timeout(),
                    now=self.wall_clock(),
                )
                if stale and self.writer is not None:
                    self._spawn(self.dra_binding.deallocate(pod, stale, log))
            made = stale_extended_claim(
                pod,
                self.cache.dra,
                enabled=self.framework.profile.kube_minor >= DRA_EXTENDED_SINCE,
            )
            if made is not None and self.writer is not None:
                self._spawn(self.dra_binding.delete_stale_claim(pod, made, log))
            found, why, rules = self._post_filter(decision, log)
            nominated: str | None = None
            message = decision.summary
            if found is None:
                message = f"{message} preemption: {why}"
                if pod.key in self.preemptor.nominations and not why.startswith("not eligible"):
                    # kube clears the nomination when no node can be freed (ModeOverride).
                    self.preemptor.end_nomination(pod.key)
                    nominated = ""
            else:
                nominated = found.node
                self._preempting(pod, found, log, rules)
            self._failed(
                info,
                log,
                trace_id,
                message,
                started,
                AttemptResult.UNSCHEDULABLE,
                nominated=nominated,
            )
            return []
        node = decision.selected
        annotations = dict(decision.annotations)
        # kube forgets the nomination when it assumes the pod
        self.preemptor.end_nomination(pod.key)
        self.cache.assume(pod, node, annotations)
        self.batch.assumed(self.cache.snapshot, node)
        plan = decision.volume_plan
        if plan is not None:  # kube's Reserve: the next cycle must not offer these PVs again
            self.cache.volumes.assume(plan)
        claims = decision.claim_plan
        if claims is not None:  # ... nor these devices
            self.cache.dra.assume(claims)
        requests = pod.resources.requests
        self.load.note_placement(
            node, key, requests.get(CPU, 0), requests.get(MEMORY, 0), self.wall_clock()
        )
        elapsed = time.perf_counter() - started
        self.metrics.observe_attempt(AttemptResult.SCHEDULED, elapsed)
        log.info("pod_assumed", node=node, duration_ms=round(elapsed * 1000, 3))
        self._spawn(
            self.bind(
                info, pod, node, annotations, log, trace_id, volume_plan=plan, claim_plan=claims
            )
        )
        return []

    def _failed(
        self,
        info: QueuedPodInfo[QueuedPod],
        log: Any,
        trace_id: str,
        message: str,
        started: float,
        result: AttemptResult,
        *,
        nominated: str | None = None,
    ) -> None:
        """The outcome picks the queue: Unschedulable waits for a cluster event that can
        help; an error (a bug, an unreadable pod) backs off, since no event would wake it.
        ``nominated``: a preemption's node for the pod's status (``""``: clear it)."""
        elapsed = time.perf_counter() - started
        self.metrics.observe_attempt(result, elapsed)
        self.metrics.count_attempt(result, self.settings.scheduler_name)
        unschedulable = result is AttemptResult.UNSCHEDULABLE
        if unschedulable:
            self.counters.unschedulable += 1
        else:
            self.counters.errors += 1
        queue = self.queue.requeue_after_failure(info, unschedulable=unschedulable, reason=message)
        log.info(
            "pod_unschedulable" if unschedulable else "pod_schedule_error",
            reason=message,
            queue=str(queue),
            duration_ms=round(elapsed * 1000, 3),
        )
        pod = info.pod
        if self.reporter is not None:
            self.reporter.failed(
                PodRef(pod.namespace, pod.name, pod.uid),
                message,
                reason=UNSCHEDULABLE if unschedulable else SCHEDULER_ERROR,
                trace_id=trace_id,
                nominated=nominated,
            )

    def _preempting(self, pod: Pod, found: Preemption, log: Any, rules: Rules | None) -> None:
        """Nominate ``pod`` to the chosen node now (the next cycles count it there); the
        writes follow in a task: victims marked and deleted, lower-priority nominations to
        that node cleared. The preemptor's own ``nominatedNodeName`` goes with its
        PodScheduled=False (:meth:`_failed`)."""
        log.info(
            "pod_preempting",
            node=found.node,
            reason="victims: " + ", ".join(f"{v.namespace}/{v.name}" for v in found.victims),
        )
        taken = reclaimed(rules, found.victims, found.node)
        self.preempt_for(f"pod {pod.uid}", [(pod, found.node)], found.victims, log, taken)

    def preempt_for(
        self,
        preemptor: str,
        nominations: Sequence[tuple[Pod, str]],
        victims: Sequence[Pod],
        log: Any,
        taken: Mapping[str, Reclaimed] | None = None,
    ) -> None:
        """One path for a pod's and a gang's preemption: each pod nominated to its node now
        (in memory; its ``nominatedNodeName`` goes with its PodScheduled=False), the
        nominations of lower-priority pods to those nodes ended, and in a task the victims
        marked, deleted and given a ``Preempted`` Event naming ``preemptor`` and their node
        (a victim ``taken`` from another quota: naming the quota and pod that reclaimed it,
        and counted in ``lattice_quota_reclaim_evictions_total``), and the ended
        nominations cleared in the API."""
        cleared = self.preemptor.nominate(nominations)
        self.metrics.preemption_victims.observe(len(victims))
        snapshot = self.cache.snapshot
        default = nominations[0][1] if nominations else ""
        placed = [(v, snapshot.node_of_pod(v.key) or default) for v in victims]
        if self.writer is not None:
            self.preemptor.evicting_for(
                [pod.key for pod, _ in nominations], [v.key for v in victims]
            )
            self._spawn(
                self.preemptor.evict(
                    preemptor,
                    placed,
                    cleared,
                    log,
                    reclaimed=taken or {},
                    counted=self.metrics.reclaim_eviction,
                )
            )

    def end_nominations(self, keys: Sequence[str]) -> None:
        """Forget these pods' nominations (by :attr:`Pod.key`): a gang whose preemption can
        no longer help (kube clears a pod's when no node can be freed)."""
        for key in keys:
            self.preemptor.end_nomination(key)

    def forget_reports(self, uid: str) -> None:
        """The pod was bound or is gone: its condition and event memory go with it."""
        if self.reporter is not None:
            self.reporter.forget(uid)

    async def bind(
        self,
        info: QueuedPodInfo[QueuedPod] | None,
        pod: Pod,
        node: str,
        annotations: dict[str, str],
        log: Any,
        trace_id: str,
        *,
        gang: str | None = None,
        gang_queued: tuple[float | None, int] | None = None,
        volume_plan: VolumePlan | None = None,
        claim_plan: ClaimPlan | None = None,
    ) -> None:
        """Bind one assumed pod through the binding cycle
        (:mod:`~scheduler.control.binding_cycle`): one path for single pods and gang
        members. ``info`` is the queue's handle of a single pod; gang members have none and
        report to ``gang`` instead (``gang_queued``: the gang entry's first-queued time and
        attempts). The PreBind steps: VolumeBinding's for ``volume_plan``, then
        DynamicResources' for ``claim_plan``'s writes."""
        steps: list[Step] = []
        if volume_plan is not None:
            steps.append(VolumeBinding(self.storage, self.writer, volume_plan, self.prebind_waits))
        if claim_plan is not None and claim_plan.writes:
            steps.append(self.dra_binding.step(claim_plan))
        await self.binding_cycle.run(
            Binding(
                info,
                Cycle(pod, node, log, trace_id),
                annotations,
                steps,
                nominate=nominates_before_prebind(pod, volume_plan, claim_plan),
                gang=gang,
                gang_queued=gang_queued,
            )
        )

    def _spawn(self, coro: Any) -> None:
        self._track(coro)

    def _track(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self, within: float) -> None:
        """Wait for in-flight bindings and reports, at most ``within`` seconds; tasks they
        start meanwhile (a gang's commit starts its bindings) are waited for too."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while self._tasks and (left := deadline - loop.time()) > 0:
            await asyncio.wait(set(self._tasks), timeout=left)

    async def shutdown(self, within: float) -> None:
        """Cancel the device searches (a hostile pod's would hold the shutdown, and so the
        lease's release, for its whole budget, and pods queued behind it for theirs; the
        next leader searches again), drain for at most ``within`` seconds, then cancel what
        is left (a solve, a report to an API server that stopped answering): no task
        outlives the scheduler."""
        searches = set(self._searches)
        for task in searches:
            task.cancel()
        if searches:
            await asyncio.gather(*searches, return_exceptions=True)
        await self.drain(within)
        self._search_pool.shutdown(wait=False, cancel_futures=True)
        left = set(self._tasks)
        for task in left:
            task.cancel()
        if left:
            await asyncio.gather(*left, return_exceptions=True)

    # -- housekeeping -------------------------------------------------------
    def tick(self) -> None:
        """Periodic: backoff and unschedulable flushes, assumed-pod expiry, gauges."""
        self.queue.flush()
        for key in self.cache.expire(self.clock()):
            self.log.warning("assumed_pod_expired", pod=key)
            for listener in self.on_expired:
                listener(key)
        gangs = self.gang_flow.gangs
        if len(gangs):
            self.gang_flow.timeouts(self.wall_clock())
        self.metrics.gangs_partial.set(gangs.partial_count())
        seq = self.cache.snapshot.affinity_graph.seq  # one per DeltaGraph patch applied
        if seq != self._graph_seq:
            self.metrics.graph_patches.inc(seq - self._graph_seq if seq > self._graph_seq else seq)
            self._graph_seq = seq
        self.metrics.set_pending(self.pending_counts())
        self.metrics.set_cache_size(self.cache.snapshot.num_nodes, self.cache.lifecycle.counts())
        self._ticks += 1
        if self._ticks % LOAD_GAUGE_EVERY == 1:
            # The one scan left here (a node's freshness is a matter of time, not of events):
            # a second between refreshes is plenty for a gauge.
            self.metrics.set_load_nodes(self.load_status_counts())
            self.set_gpu_gauges()
            self.set_quota_gauges()

    def set_quota_gauges(self) -> None:
        """used, min and max of every ElasticQuota, per resource (cpu in cores)."""
        if not len(self.quotas) and not self.metrics.quota_series:
            return
        snapshot = self.quota_snapshot()
        rows: list[tuple[str, str, str, str, float]] = []
        for quota in snapshot.quotas.values():
            for bound, vector in (("used", quota.used), ("min", quota.min), ("max", quota.max)):
                for resource, amount in vector.items():
                    value = amount / 1000 if resource == CPU else float(amount)
                    rows.append((quota.namespace, quota.name, resource, bound, value))
        self.metrics.set_quotas(rows)

    async def write_quota_statuses(self) -> None:
        """``status.used`` of every ElasticQuota whose usage changed (leader only)."""
        if self.writer is None or not len(self.quotas):
            return
        try:
            await self.quotas.write_statuses(self.writer, self.quota_snapshot())
        except Exception as exc:  # best effort: the difference is retried next round
            self.log.warning("quota_status_failed", reason=str(exc)[:200])

    def set_gpu_gauges(self) -> None:
        """The fleet's GPUs: allocatable, free, stranded (by the learned request mix)."""
        resources = self.settings.profile.gpu_placement.resources
        free = Free.of(self.cache.snapshot, resources)
        classes = self.cache.topology.gpu_demand.classes()
        gauge = self.metrics.gpus
        gauge.labels(state="allocatable").set(int(free.capacity.sum()))
        gauge.labels(state="free").set(int(free.gpus.sum()))
        gauge.labels(state="stranded").set(int(stranded(free, classes).sum()))

    def load_status_counts(self) -> dict[str, int]:
        """Cached nodes by load status (fresh/stale/unknown), for metrics and status."""
        counts = collections.Counter(
            self.load.status(name, self.wall_clock()).name.lower()
            for name in self.cache.snapshot.node_names
        )
        return dict(counts)

    def pending_counts(self) -> dict[QueueName, int]:
        """Pods waiting, by sub-queue, as kube-scheduler counts them: one per pod, so a
        gang's one entry stands for each of its pending members where it waits."""
        counts = dict(self.queue.counts())
        for gang in self.gang_flow.gangs:
            if len(gang.pending) > 1 and (where := self.queue.where(entry_key(gang.key))):
                counts[where] = counts.get(where, 0) + len(gang.pending) - 1
        return counts

    def queue_counts(self) -> dict[str, int]:
        counts = self.pending_counts()
        return {str(q): counts.get(q, 0) for q in QueueName if q is not QueueName.IN_FLIGHT}

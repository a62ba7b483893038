"""Every Prometheus metric Lattice exports, defined here and nowhere else.

Names follow ``lattice_<subsystem>_<what>_<unit>`` (units: ``seconds``, ``total`` for counters,
``pods``/``nodes`` for counts). Beside them, kube-scheduler's own names with its labels and
buckets (:data:`KUBE_SCHEDULER_NAMES`), so dashboards and alerts written for kube-scheduler
read Lattice unchanged, and the process collectors (``process_*``, ``python_*``).

Nothing is registered at import time: :meth:`Metrics.create` builds the whole set on the
:class:`~prometheus_client.CollectorRegistry` it is given, so the process owns one registry
(served by its metrics endpoint) and each test makes its own.

Label values come from fixed vocabularies (:class:`AttemptResult`, :data:`QUEUE_LABELS`,
:data:`CACHE_POD_STATES`) and are pre-created at zero, so a series exists before its first
event and a typo fails loudly instead of inventing a new series. ``plugin`` and
``extension_point`` are open sets (plugin names come from the registry) but small ones;
``profile`` is the schedulerName, pre-created per profile.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.utils import INF

NAMESPACE: Final = "lattice"

K = TypeVar("K", bound=str)


class AttemptResult(enum.StrEnum):
    SCHEDULED = "scheduled"
    UNSCHEDULABLE = "unschedulable"
    ERROR = "error"


QUEUE_LABELS: Final = ("active", "backoff", "unschedulable", "gated")
"""Values of ``queue`` on the pending-pods gauges (the scheduling queue's waiting places; the
same values as kube-scheduler's ``scheduler_pending_pods``)."""

KUBE_SCHEDULER_NAMES: Final = (
    "scheduler_schedule_attempts_total",
    "scheduler_pod_scheduling_sli_duration_seconds",
    "scheduler_pending_pods",
    "scheduler_plugin_execution_duration_seconds",
    "scheduler_preemption_attempts_total",
    "scheduler_preemption_victims",
)
"""kube-scheduler's metrics that Lattice exports under the same name, labels and buckets."""

PLUGIN_STATUSES: Final = (
    "Success",
    "Error",
    "Unschedulable",
    "UnschedulableAndUnresolvable",
    "Skip",
)
"""Values of ``status`` on plugin durations: kube-scheduler's status codes, by name."""

ATTEMPTS_CAP: Final = 15
"""kube-scheduler's cap of the ``attempts`` label of the SLI histogram ("15+")."""


def attempts_label(attempts: int) -> str:
    """The SLI histogram's ``attempts`` label, capped as kube-scheduler caps it."""
    return f"{ATTEMPTS_CAP}+" if attempts >= ATTEMPTS_CAP else str(attempts)


CACHE_POD_STATES: Final = ("assumed", "bound", "added")
LOAD_REPORT_OUTCOMES: Final = (
    "accepted",
    "duplicate",
    "out_of_order",
    "from_future",
    "invalid",
    "unreadable",
)
LOAD_STATUSES: Final = ("fresh", "stale", "unknown")
GANG_OUTCOMES: Final = (
    "optimal",
    "feasible",
    "infeasible",
    "timeout_greedy",
    "timeout_rejected",
    "greedy",
    "greedy_rejected",
    "invalid_greedy",
    "invalid",
)
"""Values of ``outcome`` on gang attempts: the solver's verdicts (``SolveStatus``; greedy and
greedy_rejected when ``spec.gang.solver`` is Greedy, which proves nothing when it fails;
the invalid ones when the best plan broke a rule, see ``gang_invalid_plans``)."""
"""Values of ``state`` on the cached-pods gauge (the cache lifecycle's counted states)."""


class PluginTimer:
    """Times plugins on sampled cycles only, as kube-scheduler does (10% of cycles): one
    observation per plugin and extension point would be a noticeable share of a cycle.
    Children are resolved once per label set, since ``labels()`` costs more than
    ``observe()``."""

    def __init__(self, histogram: Histogram, *, sample_every: int = 10) -> None:
        self.histogram = histogram
        self.sample_every = sample_every
        """1: every cycle (tests); 0: never."""
        self.on = False
        self._children: dict[tuple[str, str, str], Histogram] = {}

    def start_cycle(self, cycle: int) -> None:
        self.on = self.sample_every > 0 and cycle % self.sample_every == 0

    def observe(self, plugin: str, extension_point: str, status: str, seconds: float) -> None:
        key = (plugin, extension_point, status)
        child = self._children.get(key)
        if child is None:
            child = self.histogram.labels(
                plugin=plugin, extension_point=extension_point, status=status
            )
            self._children[key] = child
        child.observe(seconds)


def _exponential(start: float, factor: float, count: int) -> tuple[float, ...]:
    return (*(start * factor**i for i in range(count)), INF)


# Buckets after kube-scheduler's, so dashboards compare like with like.
_CYCLE_BUCKETS: Final = _exponential(0.001, 2, 15)  # 1 ms .. 16 s
_E2E_BUCKETS: Final = _exponential(0.01, 2, 20)  # 10 ms .. ~87 min
_PLUGIN_BUCKETS: Final = _exponential(0.00001, 1.5, 20)  # 10 µs .. ~22 ms
_BIND_BUCKETS: Final = _exponential(0.001, 2, 15)
_SOLVE_BUCKETS: Final = _exponential(0.001, 2, 14)  # 1 ms .. 8 s
_BINDING_WAIT_BUCKETS: Final = _exponential(0.1, 2, 14)  # 100 ms .. 27 min (timeout 600 s)


@dataclass(frozen=True, slots=True)
class Metrics:
    """The full set, bound to one registry; pass it to whatever records."""

    registry: CollectorRegistry
    schedule_attempts: Counter
    """Scheduling attempts by ``result``."""
    scheduling_cycle_duration: Histogram
    """One cycle from pop to decision (filter, score, assume), by ``result``."""
    e2e_scheduling_duration: Histogram
    """From a pod's first entry into the active queue to its successful binding."""
    plugin_execution_duration: Histogram
    """kube-scheduler's ``scheduler_plugin_execution_duration_seconds``: one plugin at one
    extension point, by ``plugin``, ``extension_point`` and ``status``; sampled cycles only,
    as kube-scheduler samples them."""
    pending_pods: Gauge
    """Pods waiting in the scheduling queue, by ``queue``."""
    kube_pending_pods: Gauge
    """kube-scheduler's ``scheduler_pending_pods``: the same counts as ``pending_pods``."""
    kube_schedule_attempts: Counter
    """kube-scheduler's ``scheduler_schedule_attempts_total`` by ``result`` and ``profile``
    (the schedulerName): "scheduled" is counted once the binding succeeded, a failed binding
    is an "error", as kube-scheduler counts them."""
    pod_scheduling_sli_duration: Histogram
    """kube-scheduler's ``scheduler_pod_scheduling_sli_duration_seconds``: first entry into
    the active queue (gated time excluded) to a successful binding, by ``attempts``."""
    preemption_attempts: Counter
    """kube-scheduler's ``scheduler_preemption_attempts_total``: PostFilter runs (one per
    failed cycle of a single pod), as kube-scheduler counts them."""
    preemption_victims: Histogram
    """kube-scheduler's ``scheduler_preemption_victims``: victims per preemption."""
    bind_duration: Histogram
    """One pods/binding call, successful or not."""
    bind_errors: Counter
    dra_allocations: Counter
    """ResourceClaims Lattice allocated (written before a binding)."""
    dra_double_allocations: Counter
    """Claim updates showing one of the claim's devices also in another allocation (two
    schedulers allocating from one pool)."""
    dra_conflicts: Counter
    """Allocations PreBind did not write: a device was in another allocation by then."""
    dra_binding_waits: Counter
    """PreBind waits for devices' binding conditions (1.36+), by ``outcome``: ready,
    failed (a failure condition), timeout, gone (the pod deleted meanwhile) or error (a
    claim gone); kube-scheduler's ``scheduler_dra_bindingconditions_allocations_total``
    counts the same per device and driver."""
    dra_binding_wait_duration: Histogram
    """How long those waits took (kube's
    ``scheduler_dra_bindingconditions_prebind_duration_seconds``)."""
    dra_allocation_duration: Histogram
    """Per attempt of a pod with claims: time in the structured allocator, all nodes."""
    dra_cel_evaluations: Histogram
    """Per attempt of a pod with claims: CEL selector evaluations run (verdicts are cached
    per device, so this stays near zero once the devices have been seen)."""
    batched_cycles: Counter
    """Cycles decided from the previous identical pod's memo (opportunistic batching)."""
    reports_dropped: Counter
    """Failed pods/binding calls (each one is a forget, a backoff and a requeue)."""
    graph_patches: Counter
    """DeltaGraph patches applied to the cached affinity graph."""
    cache_nodes: Gauge
    """Nodes in the scheduler cache."""
    cache_pods: Gauge
    """Pods in the scheduler cache, by lifecycle ``state``."""
    load_reports: Counter
    """Node load reports by ``outcome`` (accepted, duplicate, out_of_order, from_future,
    invalid, unreadable): a rising non-accepted count is an agent or clock problem."""
    load_nodes: Gauge
    """Cached nodes by load ``status`` (fresh, stale, unknown): stale nodes are scored by
    requests."""
    gang_attempts: Counter
    """Joint placements of a gang by ``outcome`` (:data:`GANG_OUTCOMES`)."""
    gang_solve_duration: Histogram
    """One gang's solve (greedy and CP-SAT), off the event loop."""
    gang_invalid_plans: Counter
    """Plans that broke a rule of their own problem (a solver bug), caught before the commit:
    replaced by greedy's, or the gang retried. Anything above 0 deserves a bug report."""
    gangs_partial: Gauge
    gpus: Gauge
    """Gangs with members bound but fewer than minMember placed (0 unless a binding failed
    or the scheduler restarted mid-gang)."""
    gang_admit_duration: Histogram
    """From a gang's quorum to its last member's binding."""
    quota_resources: Gauge
    """Per ElasticQuota and resource: ``used``, ``min`` and ``max`` (cpu in cores, other
    resources in their units: bytes, devices); a resource a quota does not bound has no
    ``max`` series."""
    quota_reclaim_evictions: Counter
    """Per ElasticQuota (``namespace``, ``quota``): its pods evicted by reclaim, that is for
    a pod of another quota (what it borrowed taken back, or, with fair share, what it held
    above its share). Preemption within one quota is not counted here."""
    _quota_series: set[tuple[str, str, str, str]] = field(default_factory=set)
    """The label sets of :attr:`quota_resources` last published (to remove the stale)."""

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> Metrics:
        """Define every metric on ``registry`` (a fresh one if None). Once per registry:
        prometheus-client refuses duplicate names."""
        reg = CollectorRegistry(auto_describe=True) if registry is None else registry
        metrics = cls(
            registry=reg,
            schedule_attempts=Counter(
                "scheduling_attempts",
                "Scheduling attempts by result.",
                ["result"],
                namespace=NAMESPACE,
                registry=reg,
            ),
            scheduling_cycle_duration=Histogram(
                "scheduling_cycle_duration_seconds",
                "Duration of one scheduling cycle (pop to decision) by result.",
                ["result"],
                namespace=NAMESPACE,
                registry=reg,
                buckets=_CYCLE_BUCKETS,
            ),
            e2e_scheduling_duration=Histogram(
                "scheduling_e2e_duration_seconds",
                "Time from a pod's first entry into the active queue to its binding.",
                namespace=NAMESPACE,
                registry=reg,
                buckets=_E2E_BUCKETS,
            ),
            plugin_execution_duration=Histogram(
                "scheduler_plugin_execution_duration_seconds",
                "Duration for running a plugin at a specific extension point.",
                ["plugin", "extension_point", "status"],
                registry=reg,
                buckets=_PLUGIN_BUCKETS,
            ),
            pending_pods=Gauge(
                "queue_pending_pods",
                "Pods waiting in the scheduling queue, by sub-queue.",
                ["queue"],
                namespace=NAMESPACE,
                registry=reg,
            ),
            kube_pending_pods=Gauge(
                "scheduler_pending_pods",
                "Number of pending pods, by the queue type. 'active' means number of pods in "
                "activeQ; 'backoff' means number of pods in backoffQ; 'unschedulable' means "
                "number of pods in unschedulablePods; 'gated' is the number of pods that are "
                "gated.",
                ["queue"],
                registry=reg,
            ),
            kube_schedule_attempts=Counter(
                "scheduler_schedule_attempts",
                "Number of attempts to schedule pods, by the result. 'unschedulable' means a "
                "pod could not be scheduled, while 'error' means an internal scheduler problem.",
                ["result", "profile"],
                registry=reg,
            ),
            pod_scheduling_sli_duration=Histogram(
                "scheduler_pod_scheduling_sli_duration_seconds",
                "E2e latency for a pod being scheduled, from the time the pod enters the "
                "scheduling queue and might involve multiple scheduling attempts.",
                ["attempts"],
                registry=reg,
                buckets=_E2E_BUCKETS,
            ),
            preemption_attempts=Counter(
                "scheduler_preemption_attempts",
                "Total preemption attempts in the cluster till now",
                registry=reg,
            ),
            preemption_victims=Histogram(
                "scheduler_preemption_victims",
                "Number of selected preemption victims",
                registry=reg,
                buckets=(1, 2, 4, 8, 16, 32, 64),
            ),
            bind_duration=Histogram(
                "binding_duration_seconds",
                "Duration of one pods/binding API call.",
                namespace=NAMESPACE,
                registry=reg,
                buckets=_BIND_BUCKETS,
            ),
            bind_errors=Counter(
                "binding_errors",
                "Failed pods/binding API calls.",
                namespace=NAMESPACE,
                registry=reg,
            ),
            dra_allocations=Counter(
                "dra_allocations",
                "ResourceClaims allocated and written by Lattice.",
                namespace=NAMESPACE,
                registry=reg,
            ),
            dra_double_allocations=Counter(
                "dra_double_allocations",
                "Claim updates with a device that another allocation also holds.",
                namespace=NAMESPACE,
                registry=reg,
            ),
            dra_conflicts=Counter(
                "dra_prebind_conflicts",
                "Allocations not written at PreBind: a device was in another allocation by then.",
                namespace=NAMESPACE,
                registry=reg,
            ),
            dra_binding_waits=Counter(
                "dra_binding_condition_waits",
                "PreBind waits for devices' binding conditions, by outcome.",
                ["outcome"],
                namespace=NAMESPACE,
                registry=reg,
            ),
            dra_binding_wait_duration=Histogram(
                "dra_binding_condition_wait_seconds",
                "Duration of PreBind waits for devices' binding conditions.",
                namespace=NAMESPACE,
                registry=reg,
                buckets=_BINDING_WAIT_BUCKETS,
            ),
            dra_allocation_duration=Histogram(
                "dra_allocation_duration_seconds",
                "Per attempt of a pod with claims: time in the DRA allocator over all nodes.",
                namespace=NAMESPACE,
                registry=reg,
                buckets=_SOLVE_BUCKETS,
            ),
            dra_cel_evaluations=Histogram(
                "dra_cel_evaluations",
                "Per attempt of a pod with claims: CEL selector evaluations run.",
                namespace=NAMESPACE,
                registry=reg,
                buckets=(0, 1, 10, 100, 1000, 10_000, 100_000),
            ),
            batched_cycles=Counter(
                "scheduling_batched_cycles",
                "Scheduling cycles decided from the previous identical pod's cycle "
                "(opportunistic batching).",
                namespace=NAMESPACE,
                registry=reg,
            ),
            reports_dropped=Counter(
                "reports_dropped",
                "Events and PodScheduled patches not written because the report queue was full.",
                namespace=NAMESPACE,
                registry=reg,
            ),
            graph_patches=Counter(
                "graph_patches",
                "DeltaGraph patches applied to the cached affinity graph.",
                namespace=NAMESPACE,
                registry=reg,
            ),
            cache_nodes=Gauge(
                "cache_size_nodes",
                "Nodes in the scheduler cache.",
                namespace=NAMESPACE,
                registry=reg,
            ),
            cache_pods=Gauge(
                "cache_size_pods",
                "Pods in the scheduler cache, by lifecycle state.",
                ["state"],
                namespace=NAMESPACE,
                registry=reg,
            ),
            load_reports=Counter(
                "load_reports",
                "Node load reports by outcome.",
                ["outcome"],
                namespace=NAMESPACE,
                registry=reg,
            ),
            load_nodes=Gauge(
                "load_nodes",
                "Cached nodes by load report status.",
                ["status"],
                namespace=NAMESPACE,
                registry=reg,
            ),
            gang_attempts=Counter(
                "gang_attempts",
                "Joint placements of a gang by solver outcome.",
                ["outcome"],
                namespace=NAMESPACE,
                registry=reg,
            ),
            gang_solve_duration=Histogram(
                "gang_solve_duration_seconds",
                "Duration of one gang's solve.",
                namespace=NAMESPACE,
                registry=reg,
                buckets=_SOLVE_BUCKETS,
            ),
            gang_invalid_plans=Counter(
                "gang_invalid_plans",
                "Gang plans that broke a rule of their own problem, caught before the commit.",
                namespace=NAMESPACE,
                registry=reg,
            ),
            gpus=Gauge(
                "gpu_devices",
                "GPUs of the cached nodes: allocatable, free, and stranded (free GPUs that no"
                " request size of the learned mix can use, by count or by the cpu and memory"
                " beside them).",
                ["state"],
                namespace=NAMESPACE,
                registry=reg,
            ),
            gangs_partial=Gauge(
                "gang_partial_gangs",
                "Gangs with some but fewer than minMember members placed.",
                namespace=NAMESPACE,
                registry=reg,
            ),
            gang_admit_duration=Histogram(
                "gang_admit_duration_seconds",
                "Time from a gang's quorum to its last member's binding.",
                namespace=NAMESPACE,
                registry=reg,
                buckets=_E2E_BUCKETS,
            ),
            quota_resources=Gauge(
                "quota_resource_units",
                "ElasticQuota amounts per resource: used (bound and assumed pods), min, max;"
                " cpu in cores, other resources in their own units.",
                ["namespace", "quota", "resource", "bound"],
                namespace=NAMESPACE,
                registry=reg,
            ),
            quota_reclaim_evictions=Counter(
                "quota_reclaim_evictions",
                "Pods of this ElasticQuota evicted by reclaim for a pod of another quota.",
                ["namespace", "quota"],
                namespace=NAMESPACE,
                registry=reg,
            ),
        )
        for outcome in GANG_OUTCOMES:
            metrics.gang_attempts.labels(outcome=outcome)
        for result in AttemptResult:
            metrics.schedule_attempts.labels(result=result)
            metrics.scheduling_cycle_duration.labels(result=result)
        for queue in QUEUE_LABELS:
            metrics.pending_pods.labels(queue=queue)
            metrics.kube_pending_pods.labels(queue=queue)
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        GCCollector(registry=reg)
        for state in CACHE_POD_STATES:
            metrics.cache_pods.labels(state=state)
        for outcome in LOAD_REPORT_OUTCOMES:
            metrics.load_reports.labels(outcome=outcome)
        for status in LOAD_STATUSES:
            metrics.load_nodes.labels(status=status)
        return metrics

    def set_load_nodes(self, counts: Mapping[str, int]) -> None:
        for status in LOAD_STATUSES:
            self.load_nodes.labels(status=status).set(counts.get(status, 0))

    @property
    def quota_series(self) -> int:
        """Quota series published now (0: nothing to remove either)."""
        return len(self._quota_series)

    def reclaim_eviction(self, namespace: str, quota: str) -> None:
        """A pod of ``namespace/quota`` evicted by reclaim."""
        self.quota_reclaim_evictions.labels(namespace=namespace, quota=quota).inc()

    def set_quotas(self, rows: Iterable[tuple[str, str, str, str, float]]) -> None:
        """Publish every quota's amounts as (namespace, quota, resource, bound, value);
        the series of a quota or resource no longer there are removed."""
        seen: set[tuple[str, str, str, str]] = set()
        for namespace, quota, resource, bound, value in rows:
            labels = (namespace, quota, resource, bound)
            seen.add(labels)
            self.quota_resources.labels(*labels).set(value)
        for labels in self._quota_series - seen:
            self.quota_resources.remove(*labels)
        self._quota_series.clear()
        self._quota_series.update(seen)

    def observe_attempt(self, result: AttemptResult, seconds: float) -> None:
        """One finished scheduling cycle: count it and time it."""
        self.schedule_attempts.labels(result=result).inc()
        self.scheduling_cycle_duration.labels(result=result).observe(seconds)

    def precreate_profile(self, profile: str) -> None:
        """kube-scheduler's attempt series of one profile, at zero before the first attempt."""
        for result in AttemptResult:
            self.kube_schedule_attempts.labels(result=result, profile=profile)

    def count_attempt(self, result: AttemptResult, profile: str, *, pods: int = 1) -> None:
        """Attempts as kube-scheduler counts them, one per pod (see
        :attr:`kube_schedule_attempts`)."""
        self.kube_schedule_attempts.labels(result=result, profile=profile).inc(pods)

    def observe_sli(self, seconds: float, *, attempts: int) -> None:
        """A pod bound ``seconds`` after it first became schedulable, in ``attempts``."""
        self.pod_scheduling_sli_duration.labels(attempts=attempts_label(attempts)).observe(seconds)

    def set_pending(self, counts: Mapping[K, int]) -> None:
        """Publish the queue's sizes (keyed by ``QueueName`` or plain strings); keys outside
        :data:`QUEUE_LABELS` (in-flight) are not pending and are skipped, missing ones are 0."""
        by_label = {str(k): v for k, v in counts.items()}
        for queue in QUEUE_LABELS:
            self.pending_pods.labels(queue=queue).set(by_label.get(queue, 0))
            self.kube_pending_pods.labels(queue=queue).set(by_label.get(queue, 0))

    def set_cache_size(self, nodes: int, pods: Mapping[K, int]) -> None:
        """Publish the cache's sizes; ``pods`` by lifecycle state (``PodState`` or strings),
        keys outside :data:`CACHE_POD_STATES` skipped."""
        self.cache_nodes.set(nodes)
        by_label = {str(k): v for k, v in pods.items()}
        for state in CACHE_POD_STATES:
            self.cache_pods.labels(state=state).set(by_label.get(state, 0))

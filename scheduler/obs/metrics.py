"""Every Prometheus metric Lattice exports, defined here and nowhere else.

Names follow ``lattice_<subsystem>_<what>_<unit>`` (units: ``seconds``, ``total`` for counters,
``pods``/``nodes`` for counts). Nothing is registered at import time: :meth:`Metrics.create`
builds the whole set on the :class:`~prometheus_client.CollectorRegistry` it is given, so the
process owns one registry (served by its metrics endpoint) and each test makes its own.

Label values come from fixed vocabularies (:class:`AttemptResult`, :data:`QUEUE_LABELS`,
:data:`CACHE_POD_STATES`) and are pre-created at zero, so a series exists before its first
event and a typo fails loudly instead of inventing a new series. ``plugin`` and
``extension_point`` are open sets (plugin names come from the registry) but small ones.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.utils import INF

NAMESPACE: Final = "lattice"

K = TypeVar("K", bound=str)


class AttemptResult(enum.StrEnum):
    SCHEDULED = "scheduled"
    UNSCHEDULABLE = "unschedulable"
    ERROR = "error"


QUEUE_LABELS: Final = ("active", "backoff", "unschedulable", "gated")
"""Values of ``queue`` on the pending-pods gauge (the scheduling queue's waiting places)."""

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
)
"""Values of ``outcome`` on gang attempts: the solver's verdicts (``SolveStatus``; the last
two when ``spec.gang.solver`` is Greedy, which proves nothing when it fails)."""
"""Values of ``state`` on the cached-pods gauge (the cache lifecycle's counted states)."""


def _exponential(start: float, factor: float, count: int) -> tuple[float, ...]:
    return (*(start * factor**i for i in range(count)), INF)


# Buckets after kube-scheduler's, so dashboards compare like with like.
_CYCLE_BUCKETS: Final = _exponential(0.001, 2, 15)  # 1 ms .. 16 s
_E2E_BUCKETS: Final = _exponential(0.01, 2, 20)  # 10 ms .. ~87 min
_PLUGIN_BUCKETS: Final = _exponential(0.00001, 1.5, 20)  # 10 µs .. ~22 ms
_BIND_BUCKETS: Final = _exponential(0.001, 2, 15)
_SOLVE_BUCKETS: Final = _exponential(0.001, 2, 14)  # 1 ms .. 8 s


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
    plugin_duration: Histogram
    """One plugin at one extension point, by ``plugin`` and ``extension_point``."""
    pending_pods: Gauge
    """Pods waiting in the scheduling queue, by ``queue``."""
    bind_duration: Histogram
    """One pods/binding call, successful or not."""
    bind_errors: Counter
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
    gangs_partial: Gauge
    """Gangs with members bound but fewer than minMember placed (0 unless a binding failed
    or the scheduler restarted mid-gang)."""
    gang_admit_duration: Histogram
    """From a gang's quorum to its last member's binding."""

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
            plugin_duration=Histogram(
                "framework_plugin_duration_seconds",
                "Duration of one plugin at one extension point.",
                ["plugin", "extension_point"],
                namespace=NAMESPACE,
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
        )
        for outcome in GANG_OUTCOMES:
            metrics.gang_attempts.labels(outcome=outcome)
        for result in AttemptResult:
            metrics.schedule_attempts.labels(result=result)
            metrics.scheduling_cycle_duration.labels(result=result)
        for queue in QUEUE_LABELS:
            metrics.pending_pods.labels(queue=queue)
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

    def observe_attempt(self, result: AttemptResult, seconds: float) -> None:
        """One finished scheduling cycle: count it and time it."""
        self.schedule_attempts.labels(result=result).inc()
        self.scheduling_cycle_duration.labels(result=result).observe(seconds)

    def set_pending(self, counts: Mapping[K, int]) -> None:
        """Publish the queue's sizes (keyed by ``QueueName`` or plain strings); keys outside
        :data:`QUEUE_LABELS` (in-flight) are not pending and are skipped, missing ones are 0."""
        by_label = {str(k): v for k, v in counts.items()}
        for queue in QUEUE_LABELS:
            self.pending_pods.labels(queue=queue).set(by_label.get(queue, 0))

    def set_cache_size(self, nodes: int, pods: Mapping[K, int]) -> None:
        """Publish the cache's sizes; ``pods`` by lifecycle state (``PodState`` or strings),
        keys outside :data:`CACHE_POD_STATES` skipped."""
        self.cache_nodes.set(nodes)
        by_label = {str(k): v for k, v in pods.items()}
        for state in CACHE_POD_STATES:
            self.cache_pods.labels(state=state).set(by_label.get(state, 0))

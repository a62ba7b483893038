"""The scheduler's shell: watch handlers, cache, queue, binder, events and status writers.

Only this package (with the agent's publisher and the CLI) talks to Kubernetes. Its pure
parts are importable without a cluster: `queue` (which pod next, and when to retry) and
`lifecycle` (a pod's states in the cache, as one transition table).
"""

from scheduler.control.lifecycle import (
    TRANSITIONS,
    IllegalTransitionError,
    NodeMismatchError,
    PodEvent,
    PodLifecycle,
    PodRecord,
    PodState,
    Transition,
    format_table,
)
from scheduler.control.queue import (
    PENDING_QUEUES,
    Clock,
    ClusterEvent,
    ClusterEventType,
    FlushResult,
    MonotonicClock,
    NodeChange,
    PodKey,
    QueueablePod,
    QueueConfig,
    QueuedPodInfo,
    QueueName,
    SchedulingQueue,
    backoff_duration,
    pod_key,
)

__all__ = [
    "PENDING_QUEUES",
    "TRANSITIONS",
    "Clock",
    "ClusterEvent",
    "ClusterEventType",
    "FlushResult",
    "IllegalTransitionError",
    "MonotonicClock",
    "NodeChange",
    "NodeMismatchError",
    "PodEvent",
    "PodKey",
    "PodLifecycle",
    "PodRecord",
    "PodState",
    "QueueConfig",
    "QueueName",
    "QueueablePod",
    "QueuedPodInfo",
    "SchedulingQueue",
    "Transition",
    "backoff_duration",
    "format_table",
    "pod_key",
]

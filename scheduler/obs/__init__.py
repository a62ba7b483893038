"""Observability vocabulary: every metric (`metrics`) and the structured-log setup and keys
(`logging`). Nothing here registers or configures anything at import time."""

from scheduler.obs.logging import (
    VOCABULARY,
    UnknownLogKeyError,
    attempt_logger,
    configure,
    new_logger,
    new_trace_id,
)
from scheduler.obs.metrics import CACHE_POD_STATES, QUEUE_LABELS, AttemptResult, Metrics

__all__ = [
    "CACHE_POD_STATES",
    "QUEUE_LABELS",
    "VOCABULARY",
    "AttemptResult",
    "Metrics",
    "UnknownLogKeyError",
    "attempt_logger",
    "configure",
    "new_logger",
    "new_trace_id",
]

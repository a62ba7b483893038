"""Structured logs: one JSON object per line, with a fixed vocabulary of keys.

Every line has ``timestamp`` (ISO 8601, UTC), ``level`` and ``event``; ``event`` is
structlog's message key and holds a short snake_case name of what happened
(``pod_bound``, not a sentence). Everything else must be one of :data:`VOCABULARY`, so a
query for ``pod="ns/name"`` or ``trace_id=...`` finds every line about that pod or attempt
whichever module wrote it. ``exception`` appears when a traceback is logged.

Unknown keys are decided by ``strict``:

* ``strict=True`` (tests, development): the log call raises :class:`UnknownLogKeyError`, so
  a new key is a test failure until it is added to the vocabulary here.
* ``strict=False`` (production default): logging must never take the scheduler down, so the
  line is written with the unknown keys moved under ``extra`` and their names listed in
  ``unknown_keys``; the top level keeps the fixed vocabulary and nothing is lost.

:func:`new_logger` builds an isolated logger on any text stream (tests); :func:`configure`
installs the same pipeline as structlog's process-wide default, once, at start-up.
:func:`attempt_logger` binds one scheduling attempt's ``pod``, ``attempt``, ``cycle`` and a
fresh ``trace_id``, so every line of that attempt can be collected.
"""

from __future__ import annotations

import logging
import secrets
import sys
from typing import Final, TextIO

import structlog
from structlog.typing import EventDict, FilteringBoundLogger, Processor, WrappedLogger

VOCABULARY: Final = frozenset(
    {
        "pod",  # namespace/name
        "gang",  # namespace/name of a PodGroup
        "node",
        "plugin",
        "trace_id",  # 32 hex digits (W3C trace-id format), one per scheduling attempt
        "cycle",  # the scheduling queue's cycle number
        "queue",  # a scheduling sub-queue: active, backoff, unschedulable, gated
        "reason",  # why: a filter's reason, a cluster event's name, an error's message
        "duration_ms",
        "attempt",  # the pod's attempt number, 1 for the first
        "event",  # structlog's message key: what happened, snake_case
    }
)
"""The keys a log call may use."""

META_KEYS: Final = frozenset({"timestamp", "level", "exception", "extra", "unknown_keys"})
"""Keys the pipeline itself adds."""


class UnknownLogKeyError(ValueError):
    """A log call used keys outside the vocabulary (raised only in strict mode)."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        super().__init__(f"log keys outside the vocabulary: {', '.join(keys)}")


def enforce_vocabulary(strict: bool) -> Processor:
    """A processor that raises on, or sets aside, keys outside :data:`VOCABULARY`."""

    def processor(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
        unknown = sorted(k for k in event_dict if k not in VOCABULARY and k not in META_KEYS)
        if not unknown:
            return event_dict
        if strict:
            raise UnknownLogKeyError(unknown)
        event_dict["extra"] = {k: event_dict.pop(k) for k in unknown}
        event_dict["unknown_keys"] = unknown
        return event_dict

    return processor


_LEADING_KEYS: Final = ("timestamp", "level", "event")


def _order_keys(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Time, level and event first, so a line reads left to right like a classic log."""
    ordered = {k: event_dict[k] for k in _LEADING_KEYS if k in event_dict}
    ordered.update(event_dict)
    return ordered


def processors(*, strict: bool) -> list[Processor]:
    """The pipeline: context, level, time, traceback, vocabulary, JSON."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        enforce_vocabulary(strict),
        _order_keys,
        structlog.processors.JSONRenderer(),
    ]


def new_logger(
    stream: TextIO | None = None, *, level: int = logging.INFO, strict: bool = False
) -> FilteringBoundLogger:
    """A logger writing JSON lines to ``stream`` (stderr by default); no global state."""
    logger: FilteringBoundLogger = structlog.wrap_logger(
        structlog.WriteLogger(sys.stderr if stream is None else stream),
        processors=processors(strict=strict),
        wrapper_class=structlog.make_filtering_bound_logger(level),
        cache_logger_on_first_use=False,
    )
    return logger


def configure(
    stream: TextIO | None = None, *, level: int = logging.INFO, strict: bool = False
) -> None:
    """Make the pipeline structlog's default, so ``structlog.get_logger()`` uses it.
    Call once at start-up (the CLI), never at import."""
    structlog.configure(
        processors=processors(strict=strict),
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.WriteLoggerFactory(sys.stderr if stream is None else stream),
        cache_logger_on_first_use=True,
    )


def new_trace_id() -> str:
    """A random trace id in W3C trace-context format (32 lowercase hex digits, not all 0)."""
    while (trace_id := secrets.token_hex(16)) == "0" * 32:  # pragma: no cover
        pass
    return trace_id


def attempt_logger(
    logger: FilteringBoundLogger,
    *,
    pod: str,
    attempt: int,
    cycle: int,
    trace_id: str | None = None,
) -> FilteringBoundLogger:
    """``logger`` bound to one scheduling attempt of ``pod`` (a new trace id unless given)."""
    return logger.bind(
        pod=pod,
        attempt=attempt,
        cycle=cycle,
        trace_id=new_trace_id() if trace_id is None else trace_id,
    )

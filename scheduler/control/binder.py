"""The binder: pods/binding calls, at most ``bindConcurrency`` in flight.

Why a class of its own: the scheduling cycle must never wait for the API. A cycle assumes
the pod and hands it here; the call runs in a task, bounded by a semaphore so a burst of
thousands of decisions does not open thousands of requests. The outcome is a value
(:class:`~scheduler.control.kubeio.BindOutcome`) that the scheduler turns into cache and
queue changes; a 409 is resolved by reading the pod (kubeio), never by a second binding.
Listeners (the feed's pod tracker) hear of each success before the scheduler acts on it,
since the answer can overtake the watch's echo.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prometheus_client import Histogram

from scheduler.control.kubeio import BindOutcome, BindResult, KubeWriter, PodRef
from scheduler.control.transient import WRITE_ERRORS, describe


class Binder:
    def __init__(self, writer: KubeWriter, *, concurrency: int, duration: Histogram) -> None:
        self.writer = writer
        self._slots = asyncio.Semaphore(concurrency)
        self.concurrency = concurrency
        self._duration = duration
        self.in_flight = 0
        self.on_bound: list[Callable[[str], None]] = []
        """Called with the pod's uid when a binding succeeded."""

    def resize(self, concurrency: int) -> None:
        """A new limit for bindings started from now on (in-flight ones keep their slot)."""
        if concurrency != self.concurrency:
            self._slots = asyncio.Semaphore(concurrency)
            self.concurrency = concurrency

    async def bind(self, ref: PodRef, node: str, annotations: dict[str, str] | None) -> BindOutcome:
        async with self._slots:
            self.in_flight += 1
            started = time.perf_counter()
            try:
                # Annotations on a Binding are copied onto the pod: the chosen devices
                # travel with the binding itself, so no second write can be lost between.
                outcome = await self.writer.bind(ref, node, annotations or None)
            except WRITE_ERRORS as exc:  # the writer's own catch missed it: same outcome
                outcome = BindOutcome(BindResult.ERROR, describe(exc))
            finally:
                self.in_flight -= 1
            self._duration.observe(time.perf_counter() - started)
        if outcome.result is BindResult.BOUND:
            for listener in self.on_bound:
                listener(ref.uid)
        return outcome

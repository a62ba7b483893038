"""A token bucket for client QPS/burst, like client-go's default rate limiter.

kube-scheduler is compared with equal client QPS, so Lattice limits its own
writes the same way rather than relying on server-side flow control.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class TokenBucket:
    """``qps`` tokens per second, at most ``burst`` saved up; ``acquire`` waits for one."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("qps must be > 0 and burst >= 1")
        self._qps = qps
        self._burst = float(burst)
        self._tokens = float(burst)
        self._clock = clock
        self._last = clock()
        self._lock = asyncio.Lock()

    @property
    def qps(self) -> float:
        return self._qps

    @property
    def burst(self) -> int:
        return int(self._burst)

    def reconfigure(self, qps: float, burst: int) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("qps must be > 0 and burst >= 1")
        self._refill()
        self._qps, self._burst = qps, float(burst)
        self._tokens = min(self._tokens, self._burst)

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._qps)
        self._last = now

    def try_acquire(self) -> bool:
        self._refill()
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False

    async def acquire(self) -> None:
        async with self._lock:  # FIFO among waiters
            if self.try_acquire():
                return
            # One sleep for exactly the deficit: the next token is ours, nobody else refills.
            await asyncio.sleep((1 - self._tokens) / self._qps)
            self._refill()
            self._tokens = max(0.0, self._tokens - 1)

"""The client-side token bucket."""

from __future__ import annotations

import pytest

from scheduler.control.ratelimit import TokenBucket


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_burst_then_qps() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=10, burst=3, clock=clock)
    assert [bucket.try_acquire() for _ in range(4)] == [True, True, True, False]
    clock.t += 0.1
    assert bucket.try_acquire()
    assert not bucket.try_acquire()
    clock.t += 10
    assert sum(bucket.try_acquire() for _ in range(10)) == 3  # never more than burst


def test_reconfigure_caps_saved_tokens() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=1, burst=10, clock=clock)
    bucket.reconfigure(qps=1, burst=2)
    assert sum(bucket.try_acquire() for _ in range(5)) == 2


@pytest.mark.parametrize(("qps", "burst"), [(0, 1), (1, 0), (-1, 5)])
def test_rejects_nonsense(qps: float, burst: int) -> None:
    with pytest.raises(ValueError, match="qps must be"):
        TokenBucket(qps=qps, burst=burst)


async def test_acquire_waits_for_a_token() -> None:
    bucket = TokenBucket(qps=1000, burst=1)
    await bucket.acquire()
    await bucket.acquire()  # waits about a millisecond, then succeeds
    assert not bucket.try_acquire()

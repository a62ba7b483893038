"""Start-up's initial lists run with the cyclic collector paused, and what they built is
frozen after (``collector_paused``): half the sync's CPU at 30 000 pods was collections."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from scheduler.control.app import collector_paused


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_paused_inside_then_on_with_the_built_objects_frozen() -> None:
    gc.enable()
    gc.unfreeze()
    with collector_paused():
        assert not gc.isenabled()
        built = [[i] for i in range(1000)]  # tracked containers, as a cache is
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(built)


def test_a_failed_sync_switches_the_collector_back_on() -> None:
    gc.enable()
    with pytest.raises(RuntimeError, match="lost the API server"), collector_paused():
        raise RuntimeError("lost the API server")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()

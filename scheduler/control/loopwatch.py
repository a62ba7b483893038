"""Whether `lattice run`'s event loop is waiting for I/O or has work: asked by the device
search's worker thread, which gives the loop the interpreter while it has work.

The loop has work from the moment ``select()`` returns until it calls ``select()`` again:
watch events, cycles, binding replies. A flag set around ``select()`` is the one signal
that covers all of it; the scheduling queue alone misses the intake and the bindings,
which are most of a plain pod's latency. The worker only reads the flag.
"""

from __future__ import annotations

import asyncio
import selectors
import weakref
from collections.abc import Callable
from typing import Any


class _WatchedSelector(selectors.DefaultSelector):
    """The platform's default selector, with :attr:`waiting` set while in ``select()``."""

    waiting: bool = False

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self.waiting = True
        try:
            events: list[tuple[selectors.SelectorKey, int]] = super().select(timeout)
            return events
        finally:
            self.waiting = False


_SELECTORS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _WatchedSelector] = (
    weakref.WeakKeyDictionary()
)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """asyncio's selector loop whose idleness :func:`busy_probe` can read."""
    selector = _WatchedSelector()
    loop = asyncio.SelectorEventLoop(selector)
    _SELECTORS[loop] = selector
    return loop


def _never() -> bool:
    return False


def busy_probe(loop: asyncio.AbstractEventLoop | Any) -> Callable[[], bool]:
    """True while ``loop`` has work (not waiting in ``select()``); safe to call from any
    thread. For a loop :func:`new_event_loop` did not make (tests, embedders), always
    False: nothing is known, so the worker keeps its ordinary pauses."""
    selector = _SELECTORS.get(loop)
    if selector is None:
        return _never
    return lambda: not selector.waiting

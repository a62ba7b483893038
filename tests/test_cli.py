"""`lattice run`'s event loop (#36, found by tests/e2e/faults): asyncio's own.

Under the fault proxy's connection resets, uvloop 0.23 left a closed socket's descriptor
registered to a dead transport; the next connect that got the descriptor raised
``RuntimeError: File descriptor N is used by transport``, which no write path treats as a
lost request, and kopf's watcher died with it, then the process (exit 1, mid-burst)."""

from __future__ import annotations

import asyncio

from scheduler.cli import _event_loop_run


def test_lattice_run_uses_asyncios_own_event_loop() -> None:
    async def loop_class() -> int:
        loop = asyncio.get_running_loop()
        assert type(loop).__module__.startswith("asyncio."), type(loop)
        return 7

    assert _event_loop_run(loop_class()) == 7

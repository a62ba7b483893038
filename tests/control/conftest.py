"""Fixtures for control tests: async tests must not leave tasks behind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest_asyncio


@pytest_asyncio.fixture
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail the test if it leaves a task running on the (session-wide) loop."""
    before = asyncio.all_tasks()
    yield
    await asyncio.sleep(0)  # let tasks that were just cancelled finish
    current = asyncio.current_task()
    leaked = {t for t in asyncio.all_tasks() - before if t is not current and not t.done()}
    for task in leaked:
        task.cancel()
    assert not leaked, f"leaked tasks: {leaked}"

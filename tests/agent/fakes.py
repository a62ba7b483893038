"""Test doubles for the agent: an in-memory TopologyApi, a clock that never sleeps, a live /proc."""

from __future__ import annotations

import asyncio
import copy
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from scheduler.agent.publisher import ConflictError
from tests.agent.trees import VM, roots

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


@dataclass
class FakeApi:
    """An in-memory TopologyApi that records calls; status writes to a missing object fail."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    node_uids: dict[str, str] = field(default_factory=dict)
    race_on_create: dict[str, Any] | None = None
    fail_get: bool = False
    fail_status: int = 0
    """How many of the next status writes fail."""
    second_get: asyncio.Event = field(default_factory=asyncio.Event)

    async def get(self, name: str) -> Mapping[str, Any] | None:
        self.calls.append("get")
        if self.calls.count("get") >= 2:
            self.second_get.set()
        if self.fail_get:
            raise ConnectionError("api server down")
        obj = self.objects.get(name)
        return copy.deepcopy(obj) if obj is not None else None

    async def create(self, body: Mapping[str, Any]) -> None:
        self.calls.append("create")
        name = body["metadata"]["name"]
        if self.race_on_create is not None:
            self.objects[name] = self.race_on_create
            raise ConflictError("already exists")
        stored = copy.deepcopy(dict(body))
        stored.pop("status", None)  # the status subresource ignores status on create
        self.objects[name] = stored

    async def replace_spec(self, name: str, spec: Mapping[str, Any]) -> None:
        self.calls.append("replace_spec")
        self.objects[name]["spec"] = copy.deepcopy(dict(spec))

    async def replace_status(self, name: str, status: Mapping[str, Any]) -> None:
        self.calls.append("replace_status")
        if self.fail_status > 0:
            self.fail_status -= 1
            raise ConnectionError("api server down")
        if name not in self.objects:
            raise LookupError(f"nodetopologies {name!r} not found")  # the server's 404
        self.objects[name]["status"] = copy.deepcopy(dict(status))

    async def node_uid(self, name: str) -> str | None:
        self.calls.append("node_uid")
        return self.node_uids.get(name)


class FakeClock:
    """Time that passes only when the agent sleeps, instantly; stops the agent at ``stop_at``."""

    def __init__(self, *, stop_at: float | None = None) -> None:
        self.elapsed = 0.0
        self.stop_at = stop_at
        self.sleeps: list[float] = []
        self.on_advance: list[Callable[[float], None]] = []

    def now(self) -> datetime:
        return T0 + timedelta(seconds=self.elapsed)

    def monotonic(self) -> float:
        return 1000.0 + self.elapsed  # any origin: only differences count

    def advance(self, seconds: float) -> None:
        self.elapsed += seconds
        for hook in self.on_advance:
            hook(self.elapsed)

    async def sleep(self, seconds: float, stop: asyncio.Event) -> None:
        self.sleeps.append(seconds)
        self.advance(max(0.0, seconds))
        if self.stop_at is not None and self.elapsed >= self.stop_at - 1e-9:
            stop.set()
        await asyncio.sleep(0)


class LiveProc:
    """A procfs tree (the VM fixture's PSI and meminfo) whose /proc/stat ticks with the clock.

    4 CPUs at USER_HZ 100; ``utilisation`` is the busy share from now on, so a test can
    shape the load over time. Attach with ``clock.on_advance.append(proc.advance)``.
    """

    CPUS = 4

    def __init__(self, root: Path, utilisation: float = 0.5) -> None:
        self.root = root
        shutil.copytree(roots(VM)[1], root)
        self.utilisation = utilisation
        self.elapsed = 0.0
        self.busy = 100_000
        self.total = 1_000_000
        self._write()

    def advance(self, elapsed: float) -> None:
        ticks = round((elapsed - self.elapsed) * 100 * self.CPUS)
        self.elapsed = elapsed
        self.total += ticks
        self.busy += round(ticks * self.utilisation)
        self._write()

    def _write(self) -> None:
        idle = self.total - self.busy
        lines = [f"cpu  {self.busy} 0 0 {idle} 0 0 0 0 0 0"]
        lines += [f"cpu{i} 0 0 0 0 0 0 0 0 0 0" for i in range(self.CPUS)]
        (self.root / "stat").write_text("\n".join(lines) + "\n")

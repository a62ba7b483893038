"""Topology levels read from Kueue (``spec.topology.fromKueue``).

An operator who runs Kueue's Topology Aware Scheduling already describes the network in
a Kueue ``Topology`` (``kueue.x-k8s.io``, cluster-scoped): ``spec.levels[].nodeLabel``,
widest first, the same thing ``spec.topology.levels`` says. ``fromKueue: NAME`` makes
that object the one place it is written.

Theory of operation
-------------------
* **Only where served.** Kueue is optional, and which versions it serves follows its
  release (v1alpha1 in its first releases with Topology, then v1beta1; v1beta2, with
  v1beta1 still served but deprecated, in the newest). Discovery
  (``/apis/kueue.x-k8s.io`` and each version's resource list) picks the newest version
  that serves ``topologies``; every version carries the same ``spec.levels``. Nothing is
  watched while no LatticeScheduler names a Topology.
* **One object, list + watch.** The named Topology is followed by the intake's own
  :class:`~scheduler.control.intake.Stream` (field selector ``metadata.name``), so a
  change arrives as it is made: Kueue's ``spec.levels`` is immutable, so a change is a
  delete and a re-create, which the watch shows as both.
* **Never fatal.** The API not served, the object missing, its levels unusable by Lattice
  (more than :data:`~scheduler.control.settings.MAX_TOPOLOGY_LEVELS`), or no right to read
  it: the levels are empty, the :class:`Resolution` says why (the LatticeScheduler's
  ``TopologyResolved`` condition, and one log line per change), and the follower keeps
  looking: discovery again every :data:`RETRY_S` seconds while the API is not served; the
  stream's own slow retry for a missing grant.
* Each new :class:`Resolution` goes to a callback, which applies the levels as a change
  of ``spec.topology.levels`` is applied (PodGroups refused for their slice level are read
  again; the next plans use the new levels).
"""

from __future__ import annotations

import asyncio
import enum
import re
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

import aiohttp
import orjson
import structlog
from kubernetes_asyncio import client

from scheduler.control.intake import (
    Batch,
    EventType,
    Intake,
    IntakeSettings,
    Relisted,
    Resource,
    Unavailable,
)
from scheduler.control.settings import SettingsError, level_problems

log = structlog.get_logger("lattice.kueue")

GROUP: Final = "kueue.x-k8s.io"
PLURAL: Final = "topologies"
RETRY_S: Final = 10.0
"""Seconds between discoveries while Kueue's Topology API is not served (only while a
LatticeScheduler names a Topology): one small GET, so Kueue installed after Lattice is
seen within seconds, not at the next restart."""
_DISCOVERY_TIMEOUT: Final = aiohttp.ClientTimeout(total=30.0)
_VERSION: Final = re.compile(r"v([1-9][0-9]*)(?:(alpha|beta)([1-9][0-9]*))?")


class Reason(enum.StrEnum):
    """The ``TopologyResolved`` condition's reason: where the levels in force come from."""

    SPEC_LEVELS = "SpecLevels"
    """No ``fromKueue``: the levels are ``spec.topology.levels``."""
    READ = "KueueTopologyRead"
    PENDING = "KueueTopologyPending"
    """Named, not read yet (start-up, or just named)."""
    NOT_SERVED = "KueueAPINotServed"
    NOT_FOUND = "KueueTopologyNotFound"
    INVALID = "KueueTopologyInvalid"
    FORBIDDEN = "KueueTopologyForbidden"


@dataclass(frozen=True, slots=True)
class Resolution:
    """What the named Topology gives: its levels, or why there are none."""

    name: str
    reason: Reason
    message: str
    levels: tuple[str, ...] = ()

    @property
    def resolved(self) -> bool:
        return self.reason is Reason.READ


def version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes' version order, as a sort key (larger is newer): GA before beta before
    alpha, then the higher number (v1 > v1beta2 > v1beta1 > v1alpha1); a name of another
    form sorts last."""
    match = _VERSION.fullmatch(version)
    if match is None:
        return (0, 0, 0)
    major, stage, minor = match.groups()
    rank = {None: 3, "beta": 2, "alpha": 1}[stage]
    return (rank, int(major), int(minor or 0))


def topology_levels(body: Mapping[str, Any]) -> tuple[str, ...]:
    """A Topology's ``spec.levels[].nodeLabel``, widest first; :class:`SettingsError` says
    why Lattice cannot use them (the rules of ``spec.topology.levels``)."""
    raw: object = (body.get("spec") or {}).get("levels")
    if not isinstance(raw, list) or not raw:
        raise SettingsError("spec.levels: no levels")
    labels: list[object] = []
    for i, level in enumerate(raw):
        if not isinstance(level, Mapping) or "nodeLabel" not in level:
            raise SettingsError(f"spec.levels[{i}]: {level!r} has no nodeLabel")
        labels.append(level["nodeLabel"])
    problems = level_problems(labels, "spec.levels")
    if problems:
        raise SettingsError("; ".join(problems))
    return tuple(str(label) for label in labels)


def resolve(name: str, version: str, body: Mapping[str, Any] | None) -> Resolution:
    """The levels of Topology ``name`` read as ``body`` (None: it does not exist)."""
    where = f"Kueue Topology {name} ({GROUP}/{version})"
    if body is None:
        return Resolution(name, Reason.NOT_FOUND, f"{where} does not exist; no levels in force")
    try:
        levels = topology_levels(body)
    except SettingsError as exc:
        return Resolution(name, Reason.INVALID, f"{where} is not usable: {exc}; no levels in force")
    return Resolution(name, Reason.READ, f"levels from {where}: {', '.join(levels)}", levels)


def pending(name: str) -> Resolution:
    return Resolution(name, Reason.PENDING, f"Kueue Topology {name} not read yet")


async def _get_json(api: client.ApiClient, path: str) -> Any | None:
    """A discovery document; None on 404 (not served)."""
    resp = await api.call_api(
        path,
        "GET",
        query_params=[],
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
        _preload_content=False,
        _request_timeout=_DISCOVERY_TIMEOUT,
    )
    try:
        data = await resp.read()
        status = int(resp.status)
    finally:
        resp.release()
    if status == 404:
        return None
    if status != 200:
        raise client.ApiException(status=status, reason=data[:300].decode(errors="replace"))
    return orjson.loads(data)


async def served_version(api: client.ApiClient) -> str | None:
    """The newest version of ``kueue.x-k8s.io`` that serves ``topologies``; None if none
    does (Kueue not installed, or a release without Topology)."""
    group = await _get_json(api, f"/apis/{GROUP}")
    if not isinstance(group, Mapping):
        return None
    versions = [
        str(v.get("version"))
        for v in group.get("versions") or []
        if isinstance(v, Mapping) and v.get("version")
    ]
    for version in sorted(versions, key=version_priority, reverse=True):
        found = await _get_json(api, f"/apis/{GROUP}/{version}")
        resources = (found or {}).get("resources") or []
        if any(isinstance(r, Mapping) and r.get("name") == PLURAL for r in resources):
            return version
    return None


async def read_once(api: client.ApiClient, name: str) -> Resolution:
    """Topology ``name`` read once (``lattice explain``, which follows nothing)."""
    version = await served_version(api)
    if version is None:
        return Resolution(
            name, Reason.NOT_SERVED, f"the API server does not serve {PLURAL}.{GROUP}"
        )
    try:
        body = await _get_json(api, f"/apis/{GROUP}/{version}/{PLURAL}/{name}")
    except client.ApiException as exc:
        if exc.status == 403:
            return Resolution(name, Reason.FORBIDDEN, f"cannot read Kueue Topology {name}")
        raise
    return resolve(name, version, body if isinstance(body, Mapping) else None)


Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[Any]"]


class KueueTopologies:
    """Follows the Topology that ``spec.topology.fromKueue`` names (see the module
    docstring); ``on_change`` gets every new :class:`Resolution`."""

    def __init__(
        self,
        api: client.ApiClient,
        on_change: Callable[[Resolution], None],
        *,
        spawn: Spawn | None = None,
        retry_s: float = RETRY_S,
        intake_settings: IntakeSettings | None = None,
    ) -> None:
        self.api = api
        self.on_change = on_change
        self._spawn: Spawn = spawn or asyncio.create_task
        self.retry_s = retry_s
        self.intake_settings = intake_settings or IntakeSettings(unavailable_retry_s=retry_s)
        self.name: str | None = None
        self.resolution: Resolution | None = None
        """The latest for :attr:`name` (None while nothing is named)."""
        self._task: asyncio.Task[Any] | None = None
        self._read = asyncio.Event()

    def follow(self, name: str | None) -> None:
        """Follow ``name`` from now on (None: nothing); the same name again changes
        nothing."""
        if name == self.name:
            return
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.name = name
        self._read.clear()
        self.resolution = None if name is None else pending(name)
        if name is not None:
            self._task = self._spawn(self._run(name))

    async def wait_read(self) -> None:
        """Until the named Topology has been looked up once (read or found wanting)."""
        await self._read.wait()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _report(self, resolution: Resolution) -> None:
        self._read.set()
        if resolution == self.resolution:
            return
        self.resolution = resolution
        if resolution.resolved:
            log.info("kueue_topology", reason=resolution.message)
        else:
            log.warning("kueue_topology", reason=f"{resolution.reason}: {resolution.message}")
        self.on_change(resolution)

    async def _run(self, name: str) -> None:
        """Discover, follow, discover again when the version goes away: until cancelled."""
        while True:
            try:
                version = await served_version(self.api)
            except (client.ApiException, aiohttp.ClientError, TimeoutError, OSError) as exc:
                log.warning("kueue_discovery_failed", reason=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(self.retry_s)
                continue
            if version is None:
                self._report(
                    Resolution(
                        name,
                        Reason.NOT_SERVED,
                        f"the API server does not serve {PLURAL}.{GROUP} (is Kueue installed?);"
                        f" looked up again every {self.retry_s:g}s; no levels in force",
                    )
                )
                await asyncio.sleep(self.retry_s)
                continue
            await self._follow(name, version)
            await asyncio.sleep(self.retry_s)

    async def _follow(self, name: str, version: str) -> None:
        """List + watch Topology ``name`` in ``version``; returns when that version is no
        longer served."""
        resource = Resource(
            key=f"{PLURAL}.{GROUP}/{name}",
            group=GROUP,
            version=version,
            plural=PLURAL,
            field_selector=f"metadata.name={name}",
        )
        async with Intake(self.api, [resource], settings=self.intake_settings) as intake:
            while True:
                for update in await intake.get():
                    if isinstance(update, Unavailable):
                        if update.status == 404:
                            return  # that version went away: discover again
                        self._report(
                            Resolution(
                                name,
                                Reason.FORBIDDEN,
                                f"cannot read Kueue Topology {name} ({GROUP}/{version}): HTTP"
                                f" {update.status}: {update.reason} (RBAC: get, list, watch on"
                                f" {PLURAL}.{GROUP}); no levels in force",
                            )
                        )
                    elif isinstance(update, Relisted):
                        found = [o for o in update.items if _name(o) == name]
                        self._report(resolve(name, version, found[-1] if found else None))
                    elif isinstance(update, Batch) and update.events:
                        last = update.events[-1]
                        gone = last.type is EventType.DELETED
                        self._report(resolve(name, version, None if gone else last.obj))


def _name(obj: Mapping[str, Any]) -> str:
    return str(cast(Mapping[str, Any], obj.get("metadata") or {}).get("name", ""))

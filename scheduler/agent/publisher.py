"""Publishing a node's NodeTopology: create it, patch it when the hardware changed, heartbeat.

Each cycle compares the spec on the server with the one just read (:func:`plan_spec`, pure:
exact equality of the JSON values, which holds because the CRD schema declares no defaults, so
the server stores what the agent wrote). Only a different spec is written, so hardware that
does not change causes no spec writes and no watch events for the scheduler's cache beyond
the heartbeat. The status (report time, PSI, warnings) is written every cycle through the
status subresource: its ``lastReportTime`` is how the scheduler tells a live agent from a
dead one.

Writes are JSON patches (the client sends ``application/json-patch+json`` for a list body)
that ``add`` the whole ``/spec`` or ``/status``: unlike a merge patch this drops fields that
disappeared (a removed GPU's ``numaNode``), and unlike a PUT it needs no resourceVersion. The
agent is the only writer of its node's object.

This module and :mod:`scheduler.agent.main` are the only ones in the agent that import the
Kubernetes client; :class:`TopologyApi` is the seam tests replace.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Protocol

import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from scheduler.agent.pci import DEFAULT_NAMING, ResourceNaming
from scheduler.agent.reader import DEFAULT_PROCFS, DEFAULT_SYSFS, NodeReading, read_node
from scheduler.agent.resource import node_topology_object
from scheduler.model.topology import GROUP, PLURAL, VERSION, NodeTopologySpec

FIELD_MANAGER: Final = "lattice-agent"

log = structlog.get_logger(__name__)


class SpecAction(enum.Enum):
    CREATE = "create"
    UPDATE = "update"
    NONE = "none"


class ConflictError(Exception):
    """The object was created by someone else between our read and our create."""


class TopologyApi(Protocol):
    async def get(self, name: str) -> Mapping[str, Any] | None:
        """The stored object, or ``None`` when there is none."""
        ...

    async def create(self, body: Mapping[str, Any]) -> None:
        """Create the object; raises :class:`ConflictError` if it already exists."""
        ...

    async def replace_spec(self, name: str, spec: Mapping[str, Any]) -> None: ...

    async def replace_status(self, name: str, status: Mapping[str, Any]) -> None: ...

    async def node_uid(self, name: str) -> str | None:
        """UID of the Node, to own the object by; ``None`` if it cannot be read."""
        ...


@dataclass(frozen=True, slots=True)
class AgentSettings:
    node_name: str
    sysfs_root: Path = DEFAULT_SYSFS
    procfs_root: Path = DEFAULT_PROCFS
    kubelet_config: Path | None = None
    naming: ResourceNaming = DEFAULT_NAMING
    interval_seconds: float = 60.0
    """Time between readings; also the heartbeat period of ``status.lastReportTime``."""

    def read(self) -> NodeReading:
        return read_node(
            sysfs_root=self.sysfs_root,
            procfs_root=self.procfs_root,
            kubelet_config=self.kubelet_config,
            naming=self.naming,
        )


def plan_spec(existing: Mapping[str, Any] | None, desired: NodeTopologySpec) -> SpecAction:
    """What to do with the spec, given the stored object (``None`` when absent)."""
    if existing is None:
        return SpecAction.CREATE
    return SpecAction.NONE if existing.get("spec") == desired else SpecAction.UPDATE


async def publish_once(
    api: TopologyApi, node_name: str, reading: NodeReading, now: datetime
) -> SpecAction:
    """Bring the server's object in line with one reading; returns what was done to the spec."""
    desired = reading.topology.to_spec()
    action = plan_spec(await api.get(node_name), desired)
    if action is SpecAction.CREATE:
        uid = await api.node_uid(node_name)
        try:
            await api.create(node_topology_object(node_name, reading.topology, node_uid=uid))
        except ConflictError:
            action = plan_spec(await api.get(node_name), desired)
    if action is SpecAction.UPDATE:
        await api.replace_spec(node_name, desired)
    await api.replace_status(node_name, reading.status(now).to_status())
    return action


async def run_publisher(
    settings: AgentSettings,
    api: TopologyApi,
    stop: asyncio.Event,
    *,
    once: bool = False,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> bool:
    """Read and publish every interval until ``stop`` is set; False if the last cycle failed.

    A failed cycle (API unreachable, forbidden, ...) is logged and retried at the next
    interval rather than ending the agent: the DaemonSet should not crash-loop while the API
    server restarts.
    """
    last_warnings: tuple[str, ...] = ()
    ok = True
    while not stop.is_set():
        reading = await asyncio.to_thread(settings.read)
        if reading.warnings != last_warnings:
            for warning in reading.warnings:
                log.warning("topology reading degraded", node=settings.node_name, reason=warning)
            last_warnings = reading.warnings
        try:
            action = await publish_once(api, settings.node_name, reading, clock())
        except Exception as exc:  # retried next cycle; see docstring
            ok = False
            log.error("publish failed", node=settings.node_name, error=repr(exc))
        else:
            ok = True
            if action is not SpecAction.NONE:
                log.info("topology published", node=settings.node_name, action=action.value)
        if once:
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=settings.interval_seconds)
    return ok


class KubernetesTopologyApi:
    """:class:`TopologyApi` over kubernetes-asyncio's CustomObjectsApi."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)

    async def get(self, name: str) -> Mapping[str, Any] | None:
        try:
            body: Mapping[str, Any] = await self._custom.get_cluster_custom_object(
                GROUP, VERSION, PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return body

    async def create(self, body: Mapping[str, Any]) -> None:
        try:
            await self._custom.create_cluster_custom_object(
                GROUP, VERSION, PLURAL, body, field_manager=FIELD_MANAGER
            )
        except ApiException as exc:
            if exc.status == 409:
                raise ConflictError(str(exc.reason)) from exc
            raise

    async def replace_spec(self, name: str, spec: Mapping[str, Any]) -> None:
        await self._custom.patch_cluster_custom_object(
            GROUP,
            VERSION,
            PLURAL,
            name,
            [{"op": "add", "path": "/spec", "value": spec}],
            field_manager=FIELD_MANAGER,
        )

    async def replace_status(self, name: str, status: Mapping[str, Any]) -> None:
        await self._custom.patch_cluster_custom_object_status(
            GROUP,
            VERSION,
            PLURAL,
            name,
            [{"op": "add", "path": "/status", "value": status}],
            field_manager=FIELD_MANAGER,
        )

    async def node_uid(self, name: str) -> str | None:
        try:
            node = await self._core.read_node(name)
        except ApiException as exc:
            log.warning("cannot read node; object will have no owner", node=name, error=exc.status)
            return None
        uid = node.metadata.uid if node.metadata is not None else None
        return str(uid) if uid else None

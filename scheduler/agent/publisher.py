"""Publishing a node's NodeTopology: create it, patch it when the hardware changed, heartbeat.

The spec is compared with the one on the server (:func:`plan_spec`, pure: exact equality of
the JSON values, which holds because the CRD schema declares no defaults, so the server
stores what the agent wrote). Only a different spec is written, so hardware that does not
change causes no spec writes and no watch events for the scheduler's cache beyond the
heartbeat. The status (report time, PSI, load, warnings) is written at every report through
the status subresource: its ``lastReportTime`` is how the scheduler tells a live agent from a
dead one.

:func:`publish_once` reads the object every call (the dev cluster's simulated agents use it,
seldom). The agent itself reports every 15 s, where a GET per report would double its API
traffic, so :class:`Publisher` remembers the spec it last wrote or saw and reads the object
again only at the first report, after a failed one (the object may have been deleted or
edited meanwhile), or when the hardware reading changed. A steady node therefore costs one
status patch per report.

Writes are JSON patches (the client sends ``application/json-patch+json`` for a list body)
that ``add`` the whole ``/spec`` or ``/status``: unlike a merge patch this drops fields that
disappeared (a removed GPU's ``numaNode``), and unlike a PUT it needs no resourceVersion. The
agent is the only writer of its node's object.

This module and :mod:`scheduler.agent.main` are the only ones in the agent that import the
Kubernetes client; :class:`TopologyApi` is the seam tests replace.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, Protocol

import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from scheduler.agent.reader import NodeReading
from scheduler.agent.resource import node_topology_object
from scheduler.agent.runner import SYSTEM_CLOCK, AgentSettings, Clock, run_agent
from scheduler.model.topology import GROUP, PLURAL, VERSION, NodeTopology, NodeTopologySpec

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


def plan_spec(existing: Mapping[str, Any] | None, desired: NodeTopologySpec) -> SpecAction:
    """What to do with the spec, given the stored object (``None`` when absent)."""
    if existing is None:
        return SpecAction.CREATE
    return SpecAction.NONE if existing.get("spec") == desired else SpecAction.UPDATE


async def publish_once(
    api: TopologyApi, node_name: str, reading: NodeReading, now: datetime
) -> SpecAction:
    """Bring the server's object in line with one reading; returns what was done to the spec."""
    action = await sync_spec(api, node_name, reading.topology)
    await api.replace_status(node_name, reading.status(now).to_status())
    return action


async def sync_spec(api: TopologyApi, node_name: str, topology: NodeTopology) -> SpecAction:
    """Read the object and create it or replace its spec if it differs from ``topology``."""
    desired = topology.to_spec()
    action = plan_spec(await api.get(node_name), desired)
    if action is SpecAction.CREATE:
        uid = await api.node_uid(node_name)
        try:
            await api.create(node_topology_object(node_name, topology, node_uid=uid))
        except ConflictError:
            action = plan_spec(await api.get(node_name), desired)
    if action is SpecAction.UPDATE:
        await api.replace_spec(node_name, desired)
    return action


class Publisher:
    """Publishes one node's readings, reading the object back only when it has to."""

    def __init__(self, api: TopologyApi, node_name: str) -> None:
        self._api = api
        self._node_name = node_name
        # The spec the server holds, as far as we know; None: go and look.
        self._known_spec: NodeTopologySpec | None = None

    async def publish(self, reading: NodeReading, now: datetime) -> SpecAction:
        desired = reading.topology.to_spec()
        action = SpecAction.NONE
        try:
            if desired != self._known_spec:
                self._known_spec = None
                action = await sync_spec(self._api, self._node_name, reading.topology)
                self._known_spec = desired
            await self._api.replace_status(self._node_name, reading.status(now).to_status())
        except BaseException:
            self._known_spec = None  # deleted, edited, or never created: look again next time
            raise
        if action is not SpecAction.NONE:
            log.info("topology published", node=self._node_name, action=action.value)
        return action


async def run_publisher(
    settings: AgentSettings,
    api: TopologyApi,
    stop: asyncio.Event,
    *,
    once: bool = False,
    clock: Clock = SYSTEM_CLOCK,
) -> bool:
    """Sample and publish (see :mod:`scheduler.agent.runner`); False if the last report failed."""
    publisher = Publisher(api, settings.node_name)
    return await run_agent(settings, publisher.publish, stop, once=once, clock=clock)


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

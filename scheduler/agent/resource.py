"""The NodeTopology object as sent to the API server.

Pure: builds the body (apiVersion, kind, metadata, spec, status) from a reading, for both the
dry-run printout and the publisher, so what ``--dry-run`` shows is exactly what would be
written. The object has the node's name; when the node's UID is known it is owned by the
Node, so deleting the node garbage-collects its topology.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from scheduler.model.topology import (
    API_VERSION,
    KIND,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NodeTopology,
    NodeTopologySpec,
    NodeTopologyStatus,
    NodeTopologyStatusSpec,
)

__all__ = ["MANAGED_BY", "MANAGED_BY_LABEL", "node_topology_object"]


class OwnerReference(TypedDict):
    apiVersion: str
    kind: str
    name: str
    uid: str


class ObjectMeta(TypedDict):
    name: str
    labels: dict[str, str]
    ownerReferences: NotRequired[list[OwnerReference]]


class NodeTopologyObject(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: NodeTopologySpec
    status: NotRequired[NodeTopologyStatusSpec]


def node_topology_object(
    node_name: str,
    topology: NodeTopology,
    status: NodeTopologyStatus | None = None,
    *,
    node_uid: str | None = None,
) -> NodeTopologyObject:
    metadata: ObjectMeta = {"name": node_name, "labels": {MANAGED_BY_LABEL: MANAGED_BY}}
    if node_uid is not None:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}
        ]
    body: NodeTopologyObject = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": topology.to_spec(),
    }
    if status is not None:
        body["status"] = status.to_status()
    return body

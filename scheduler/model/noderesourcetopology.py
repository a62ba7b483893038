"""NodeResourceTopology objects (``topology.node.k8s.io``) read as a NUMA-only view.

NFD's topology-updater and the resource-topology-exporter publish one NodeResourceTopology
per node, as consumed by scheduler-plugins' NodeResourceTopologyMatch: a list of zones, one
of type ``Node`` per NUMA node (named ``node-<id>``), each with per-resource ``capacity``,
``allocatable`` and ``available`` amounts and a ``costs`` row of distances to the other
zones (the firmware's SLIT). Lattice reads them only for nodes that have no NodeTopology of
its own agent: they know NUMA zones and how many devices of each resource a zone holds,
but not the PCIe tree, so nothing below NUMA (switches, device identities) is known.

Theory of operation
-------------------
* Zones of other types (sockets, cores, caches) are ignored; a NUMA zone's id comes from
  its name (``node-3`` -> 3), as scheduler-plugins does, since the objects carry no number.
* Amounts are integers as kube-scheduler rounds them: cpu in millicores, everything else
  in units (``Value``), so they compare directly with pod requests.
* v1alpha2 states the kubelet policy in top-level ``attributes`` (``topologyManagerPolicy``,
  ``topologyManagerScope``); v1alpha1 and older exporters used ``topologyPolicies``
  (``SingleNUMANodeContainerLevel`` ...). Both are read; the attribute wins.
* Missing or malformed distances fall back to the kernel's 10 (local) / 20 (remote).

Pure data, no I/O. Malformed objects raise :class:`TopologyParseError`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from scheduler.model.errors import InvalidObjectError
from scheduler.model.names import CPU
from scheduler.model.quantity import Quantity
from scheduler.model.topology import (
    LOCAL_NUMA_DISTANCE,
    TopologyManagerPolicy,
    TopologyManagerScope,
    TopologyParseError,
)

GROUP: Final = "topology.node.k8s.io"
VERSION: Final = "v1alpha2"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "NodeResourceTopology"
PLURAL: Final = "noderesourcetopologies"
NUMA_ZONE_TYPE: Final = "Node"
REMOTE_DISTANCE: Final = 20
"""The kernel's default distance between distinct NUMA nodes when firmware gives none."""

_ZONE_NAME = re.compile(r"^node-(\d+)$")
_LEGACY_POLICIES: Final = (
    ("SingleNUMANode", TopologyManagerPolicy.SINGLE_NUMA_NODE),
    ("Restricted", TopologyManagerPolicy.RESTRICTED),
    ("BestEffort", TopologyManagerPolicy.BEST_EFFORT),
    ("None", TopologyManagerPolicy.NONE),
)


@dataclass(frozen=True, slots=True)
class ZoneResource:
    """One resource of one zone (cpu in millicores, everything else in units)."""

    capacity: int
    allocatable: int
    available: int
    """Allocatable minus what running pods hold, as the exporter last saw it."""


@dataclass(frozen=True, slots=True)
class NumaZone:
    numa_id: int
    resources: Mapping[str, ZoneResource] = field(default_factory=dict)
    costs: Mapping[int, int] = field(default_factory=dict)
    """Distance to other NUMA zones by id, as published (may be partial)."""

    def allocatable(self, resource: str) -> int:
        entry = self.resources.get(resource)
        return entry.allocatable if entry is not None else 0

    def available(self, resource: str) -> int:
        entry = self.resources.get(resource)
        return entry.available if entry is not None else 0


@dataclass(frozen=True)
class NodeResourceTopology:
    """The NUMA view of one node from its NodeResourceTopology object."""

    node_name: str
    zones: tuple[NumaZone, ...]
    """NUMA zones sorted by id."""
    topology_manager_policy: TopologyManagerPolicy | None = None
    topology_manager_scope: TopologyManagerScope | None = None

    def __post_init__(self) -> None:
        ids = [z.numa_id for z in self.zones]
        if ids != sorted(set(ids)):
            raise ValueError(f"NUMA zones must be sorted by id without duplicates: {ids}")

    @property
    def numa_ids(self) -> tuple[int, ...]:
        return tuple(z.numa_id for z in self.zones)

    def distances(self) -> tuple[tuple[int, ...], ...]:
        """The distance matrix aligned with :attr:`zones`, with 10/20 where costs are missing."""
        rows = []
        for zone in self.zones:
            row = []
            for other in self.zones:
                fallback = LOCAL_NUMA_DISTANCE if other is zone else REMOTE_DISTANCE
                row.append(zone.costs.get(other.numa_id, fallback))
            rows.append(tuple(row))
        return tuple(rows)

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> NodeResourceTopology:
        try:
            return _parse(body)
        except TopologyParseError:
            raise
        except (InvalidObjectError, KeyError, TypeError, ValueError) as exc:
            raise TopologyParseError(f"invalid NodeResourceTopology: {exc}") from exc


def _parse(body: Mapping[str, Any]) -> NodeResourceTopology:
    metadata = _mapping(body.get("metadata"), "metadata")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise TopologyParseError("metadata.name must be a non-empty string")
    numa: list[tuple[int, str, Mapping[str, Any]]] = []
    for i, raw in enumerate(_list(body.get("zones"), "zones")):
        zone = _mapping(raw, f"zones[{i}]")
        zone_name = zone.get("name")
        if zone.get("type") != NUMA_ZONE_TYPE or not isinstance(zone_name, str):
            continue
        m = _ZONE_NAME.match(zone_name)
        if m is not None:
            numa.append((int(m.group(1)), zone_name, zone))
    zone_ids = {zone_name: numa_id for numa_id, zone_name, _ in numa}
    zones = [
        NumaZone(
            numa_id=numa_id,
            resources=MappingProxyType(_resources(zone.get("resources"), zone_name)),
            costs=MappingProxyType(_costs(zone.get("costs"), zone_ids, zone_name)),
        )
        for numa_id, zone_name, zone in numa
    ]
    zones.sort(key=lambda z: z.numa_id)
    policy, scope = _policy(body)
    return NodeResourceTopology(
        node_name=name,
        zones=tuple(zones),
        topology_manager_policy=policy,
        topology_manager_scope=scope,
    )


def _resources(raw: object, where: str) -> dict[str, ZoneResource]:
    out: dict[str, ZoneResource] = {}
    for j, item in enumerate(_list(raw, f"{where}.resources")):
        entry = _mapping(item, f"{where}.resources[{j}]")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise TopologyParseError(f"{where}.resources[{j}].name must be a non-empty string")
        path = f"{where}.resources[{name}]"
        capacity = _amount(name, entry.get("capacity"), f"{path}.capacity")
        allocatable = _amount(name, entry.get("allocatable", entry.get("capacity")), path)
        available = _amount(name, entry.get("available", allocatable), f"{path}.available")
        out[name] = ZoneResource(capacity, allocatable, available)
    return out


def _amount(resource: str, raw: object, where: str) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        quantity = Quantity.from_units(raw)
    else:
        quantity = Quantity.parse(raw, field=where)
    return quantity.milli_value() if resource == CPU else quantity.value()


def _costs(raw: object, zone_ids: Mapping[str, int], where: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for j, item in enumerate(_list(raw, f"{where}.costs")):
        entry = _mapping(item, f"{where}.costs[{j}]")
        target, value = entry.get("name"), entry.get("value")
        if not isinstance(target, str) or target not in zone_ids:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TopologyParseError(f"{where}.costs[{j}].value must be a non-negative integer")
        out[zone_ids[target]] = value
    return out


def _policy(
    body: Mapping[str, Any],
) -> tuple[TopologyManagerPolicy | None, TopologyManagerScope | None]:
    policy: TopologyManagerPolicy | None = None
    scope: TopologyManagerScope | None = None
    for legacy in _list(body.get("topologyPolicies"), "topologyPolicies"):
        if not isinstance(legacy, str):
            continue
        for prefix, legacy_policy in _LEGACY_POLICIES:
            if legacy.startswith(prefix):
                policy = legacy_policy
                if legacy.endswith("PodLevel"):
                    scope = TopologyManagerScope.POD
                elif legacy.endswith("ContainerLevel"):
                    scope = TopologyManagerScope.CONTAINER
                break
    for j, item in enumerate(_list(body.get("attributes"), "attributes")):
        entry = _mapping(item, f"attributes[{j}]")
        name, value = entry.get("name"), entry.get("value")
        if name == "topologyManagerPolicy" and isinstance(value, str):
            try:
                policy = TopologyManagerPolicy(value)
            except ValueError as exc:
                raise TopologyParseError(f"unknown topologyManagerPolicy {value!r}") from exc
        elif name == "topologyManagerScope" and isinstance(value, str):
            try:
                scope = TopologyManagerScope(value)
            except ValueError as exc:
                raise TopologyParseError(f"unknown topologyManagerScope {value!r}") from exc
    return policy, scope


def _mapping(raw: object, where: str) -> Mapping[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise TopologyParseError(f"{where} must be an object, got {type(raw).__name__}")
    return raw


def _list(raw: object, where: str) -> Sequence[Any]:
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):
        raise TopologyParseError(f"{where} must be a list, got {type(raw).__name__}")
    return raw

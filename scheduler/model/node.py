"""Node and namespace records parsed from API bodies.

A :class:`Node` keeps only what scheduling reads: labels, taints, ``spec.unschedulable`` and
``status.allocatable`` rounded to the integers kube-scheduler compares (cpu in millicores,
memory/storage/hugepages in bytes, ``pods`` as a count, extended resources as counts).
Resources kube-scheduler does not track are dropped, so a node that lacks a resource simply
has no entry (treated as zero allocatable, i.e. any request is Insufficient).
``status.declaredFeatures`` is kept as a set of names (see
:mod:`scheduler.model.declared_features`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from scheduler.model._fields import mapping as _mapping
from scheduler.model._fields import string_map as _string_map
from scheduler.model.declared_features import declared_features, feature_bits
from scheduler.model.errors import InvalidObjectError
from scheduler.model.names import CPU, PODS, is_tracked_resource
from scheduler.model.quantity import to_int64
from scheduler.model.resources import parse_resource_list


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = TaintEffect.NO_SCHEDULE.value

    @property
    def blocks_scheduling(self) -> bool:
        """NoSchedule and NoExecute taints filter; PreferNoSchedule only scores."""
        return self.effect in (TaintEffect.NO_SCHEDULE, TaintEffect.NO_EXECUTE)


@dataclass(frozen=True)
class Node:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    allocatable: Mapping[str, int] = field(default_factory=dict)
    """Rounded allocatable amounts, including ``pods``; absent means zero."""
    uid: str = ""
    declared_features: frozenset[str] = frozenset()
    """``status.declaredFeatures``: what the kubelet says it supports (KEP-5328)."""

    @property
    def declared_feature_bits(self) -> int:
        """The declared features a pod can need, as bits (unknown names have none)."""
        return feature_bits(self.declared_features)

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> Node:
        metadata = _mapping(body.get("metadata"), "metadata")
        spec = _mapping(body.get("spec"), "spec")
        status = _mapping(body.get("status"), "status")
        name = metadata.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidObjectError("metadata.name", name, "a node needs a name")
        labels = _string_map(metadata.get("labels"), "metadata.labels")
        taints: list[Taint] = []
        raw_taints = spec.get("taints") or []
        if not isinstance(raw_taints, list):
            raise InvalidObjectError("spec.taints", raw_taints, "must be a list")
        for i, t in enumerate(raw_taints):
            path = f"spec.taints[{i}]"
            t = _mapping(t, path)
            key, value, effect = t.get("key"), t.get("value", ""), t.get("effect")
            if not isinstance(key, str) or not key:
                raise InvalidObjectError(f"{path}.key", key, "a taint needs a key")
            if value is None:
                value = ""
            if not isinstance(value, str):
                raise InvalidObjectError(f"{path}.value", value, "must be a string")
            if effect not in [e.value for e in TaintEffect]:
                raise InvalidObjectError(
                    f"{path}.effect",
                    effect,
                    "must be one of NoSchedule, PreferNoSchedule, NoExecute",
                )
            taints.append(Taint(key, value, str(effect)))
        unschedulable = spec.get("unschedulable", False)
        if not isinstance(unschedulable, bool):
            raise InvalidObjectError("spec.unschedulable", unschedulable, "must be a boolean")
        exact = parse_resource_list(status.get("allocatable"), field="status.allocatable")
        allocatable: dict[str, int] = {}
        for res, q in exact.items():
            if res != PODS and not is_tracked_resource(res):
                continue
            value = q.milli_value() if res == CPU else q.value()
            allocatable[res] = to_int64(value, field=f"status.allocatable[{res}]", raw=q)
        uid = metadata.get("uid") or ""
        return cls(
            name=name,
            labels=MappingProxyType(labels),
            taints=tuple(taints),
            unschedulable=unschedulable,
            allocatable=MappingProxyType(allocatable),
            uid=str(uid),
            declared_features=declared_features(
                status.get("declaredFeatures"), "status.declaredFeatures"
            ),
        )


@dataclass(frozen=True)
class Namespace:
    """Namespaces matter only through their labels (namespaceSelector in pod affinity)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> Namespace:
        metadata = _mapping(body.get("metadata"), "metadata")
        name = metadata.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidObjectError("metadata.name", name, "a namespace needs a name")
        return cls(name, MappingProxyType(_string_map(metadata.get("labels"), "metadata.labels")))

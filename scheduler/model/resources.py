"""Resource lists and the effective pod request, following component-helpers ``PodRequests``.

The effective request of a pod is computed on exact quantities and rounded once at the end,
exactly like kube-scheduler (which sums ``resource.Quantity`` values and only then calls
``MilliValue``/``Value``):

* regular containers are summed;
* init containers run one at a time, so the pod needs the *max* over them; a sidecar
  (an init container with ``restartPolicy: Always``) keeps running, so its request is added
  to the pod total *and* to every later init container's peak;
* pod-level ``spec.resources.requests`` (cpu, memory, hugepages-*) override the aggregate;
* ``spec.overhead`` is added on top.

``non_missing`` implements kube-scheduler's "non-zero" requests used for scoring: a
container that does not mention cpu (memory) is treated as asking for 100m (200Mi).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from scheduler.model.errors import InvalidObjectError
from scheduler.model.names import CPU, HUGEPAGES_PREFIX, MEMORY, is_tracked_resource
from scheduler.model.quantity import Quantity, to_int64

ResourceList = Mapping[str, Quantity]
"""Exact quantities by resource name (a ``v1.ResourceList``)."""

IntResources = Mapping[str, int]
"""Rounded integer amounts: cpu in millicores, everything else in units (bytes, devices)."""

DEFAULT_MILLI_CPU_REQUEST: Final = 100
DEFAULT_MEMORY_REQUEST: Final = 200 * 1024 * 1024
DEFAULT_NON_MISSING: Final[ResourceList] = MappingProxyType(
    {
        CPU: Quantity.from_milli(DEFAULT_MILLI_CPU_REQUEST),
        MEMORY: Quantity.from_units(DEFAULT_MEMORY_REQUEST),
    }
)


@dataclass(frozen=True, slots=True)
class ContainerResources:
    """What the request computation needs to know about one container."""

    name: str
    requests: ResourceList
    sidecar: bool = False
    """An init container with ``restartPolicy: Always``."""
    status_requests: ResourceList | None = None
    """``status.containerStatuses[].resources.requests`` when reported (in-place resize)."""
    allocated: ResourceList | None = None
    """``status.containerStatuses[].allocatedResources`` when reported."""


def parse_resource_list(raw: object, *, field: str) -> dict[str, Quantity]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise InvalidObjectError(field, raw, "a resource list must be a map")
    out: dict[str, Quantity] = {}
    for name, value in raw.items():
        if not isinstance(name, str):
            raise InvalidObjectError(field, name, "resource names must be strings")
        quantity = Quantity.parse(value, field=f"{field}[{name}]")
        if quantity.nanos < 0:
            raise InvalidObjectError(
                f"{field}[{name}]", value, "must be greater than or equal to 0"
            )
        out[name] = quantity
    return out


def _add(total: dict[str, Quantity], other: ResourceList) -> None:
    for name, q in other.items():
        total[name] = total[name] + q if name in total else q


def _max_into(total: dict[str, Quantity], other: ResourceList) -> None:
    for name, q in other.items():
        if name not in total or q > total[name]:
            total[name] = q


def _with_non_missing(requests: ResourceList, non_missing: ResourceList | None) -> ResourceList:
    if not non_missing:
        return requests
    out = dict(requests)
    for name, q in non_missing.items():
        if name not in requests:
            out[name] = q
    return out


def _effective_container_requests(
    c: ContainerResources, use_status: bool, resize_infeasible: bool
) -> ResourceList:
    if not use_status or c.status_requests is None:
        return c.requests
    merged: dict[str, Quantity] = {}
    if not resize_infeasible:
        _max_into(merged, c.requests)
    _max_into(merged, c.status_requests)
    if c.allocated is not None:
        _max_into(merged, c.allocated)
    return merged


def is_pod_level_resource(name: str) -> bool:
    return name in (CPU, MEMORY) or name.startswith(HUGEPAGES_PREFIX)


def pod_requests(
    containers: Iterable[ContainerResources],
    init_containers: Iterable[ContainerResources],
    *,
    pod_level: ResourceList | None = None,
    overhead: ResourceList | None = None,
    non_missing: ResourceList | None = None,
    use_status: bool = False,
    resize_infeasible: bool = False,
) -> dict[str, Quantity]:
    """Exact effective requests of a pod (``resourcehelper.PodRequests``)."""
    total: dict[str, Quantity] = {}
    for c in containers:
        reqs = _effective_container_requests(c, use_status, resize_infeasible)
        _add(total, _with_non_missing(reqs, non_missing))
    sidecars: dict[str, Quantity] = {}
    init_peak: dict[str, Quantity] = {}
    for c in init_containers:
        reqs = _effective_container_requests(c, use_status and c.sidecar, resize_infeasible)
        reqs = _with_non_missing(reqs, non_missing)
        if c.sidecar:
            _add(total, reqs)
            _add(sidecars, reqs)
            peak: ResourceList = dict(sidecars)
        else:
            tmp: dict[str, Quantity] = {}
            _add(tmp, reqs)
            _add(tmp, sidecars)
            peak = tmp
        _max_into(init_peak, peak)
    _max_into(total, init_peak)
    if pod_level and any(is_pod_level_resource(n) for n in pod_level):
        for name, q in pod_level.items():
            if is_pod_level_resource(name):
                total[name] = q
    if overhead:
        _add(total, overhead)
    return total


def round_resources(requests: ResourceList, *, field: str) -> dict[str, int]:
    """Round exact requests to the integers kube-scheduler compares (``Resource.Add``).

    cpu becomes millicores (``MilliValue``), every other tracked resource ``Value()``;
    resources kube-scheduler does not track (e.g. ``pods`` in a request, unprefixed
    unknown names) are dropped.
    """
    out: dict[str, int] = {}
    for name, q in requests.items():
        if not is_tracked_resource(name):
            continue
        value = q.milli_value() if name == CPU else q.value()
        out[name] = to_int64(value, field=f"{field}[{name}]", raw=q)
    return out

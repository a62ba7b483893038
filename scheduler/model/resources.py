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

In-place resize (GA since 1.35) makes what a *placed* pod holds depend on its status too:
what the kubelet has allocated and actuated may differ from the spec while a resize is in
flight, and the node must be charged the larger. How the status is read changed between
releases (:class:`StatusRules`), so the bound pod's request is computed with the rules of
the release Lattice mirrors; the request of a pod being scheduled reads the spec only, as
NodeResourcesFit's PreFilter does in every release.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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
    """What the request computation needs to know about one container.

    Empty status lists are kept as ``None``: the API server omits them (``omitempty``) and
    kube-scheduler's protobuf decoding turns an empty map into nil, which is what the
    helpers test for.
    """

    name: str
    requests: ResourceList
    sidecar: bool = False
    """An init container with ``restartPolicy: Always``."""
    reported: bool = False
    """``status.containerStatuses[].resources`` is set (1.35/1.36 read the status only then)."""
    actuated: ResourceList | None = None
    """``status.containerStatuses[].resources.requests``: what the kubelet has actuated."""
    allocated: ResourceList | None = None
    """``status.containerStatuses[].allocatedResources``: what the kubelet has admitted."""

    @property
    def differs(self) -> bool:
        """Its status says what its spec does not: a resize in flight (a running
        container's status repeats its spec otherwise)."""
        return (self.actuated is not None and self.actuated != self.requests) or (
            self.allocated is not None and self.allocated != self.requests
        )


@dataclass(frozen=True, slots=True)
class PodStatusResources:
    """The pod-level status of in-place resize (KEP-5419): ``status.resources`` and
    ``status.allocatedResources``, which a 1.36+ kubelet with
    InPlacePodLevelResourcesVerticalScaling writes for every pod (as ``PodRequests`` of the
    pod, overhead included)."""

    reported: bool = False
    """``status.resources`` is set."""
    actuated: ResourceList | None = None
    """``status.resources.requests``."""
    allocated: ResourceList | None = None
    """``status.allocatedResources``."""


NO_POD_STATUS: Final = PodStatusResources()


@dataclass(frozen=True, slots=True)
class RequestInputs:
    """Everything of one pod that its effective request depends on, parsed once."""

    containers: tuple[ContainerResources, ...]
    init_containers: tuple[ContainerResources, ...] = ()
    pod_level: ResourceList = field(default_factory=dict)
    """``spec.resources.requests`` (pod-level resources)."""
    overhead: ResourceList = field(default_factory=dict)
    status: PodStatusResources = NO_POD_STATUS
    resize_infeasible: bool = False
    """The pod's ``PodResizePending`` condition has reason ``Infeasible``: the spec asks for
    what the node cannot give, so only the status counts."""

    @property
    def status_matters(self) -> bool:
        """Some release could account this pod other than by its spec. Not without status
        (a pod being scheduled) nor when every container status repeats its spec: each
        reading is then the spec's, even with the defaults of ``non_missing``."""
        return (
            self.resize_infeasible
            or self.status.reported
            or self.status.allocated is not None
            or any(c.differs for c in self.containers)
            or any(c.differs for c in self.init_containers)
        )


POD_LEVEL_STATUS_SINCE: Final = 36
"""InPlacePodLevelResourcesVerticalScaling: alpha (off) in 1.35, beta (on) since 1.36."""
MAX_OF_AGGREGATES_SINCE: Final = 37
"""component-helpers 1.37 (kubernetes#140047): max of the aggregates, not per container."""


@dataclass(frozen=True, slots=True)
class StatusRules:
    """How one release's kube-scheduler reads in-place resize status when it accounts a
    pod on a node (``PodInfo.CalculateResource`` and the scorers: ``UseStatusResources``
    is on in every supported release, InPlacePodVerticalScaling being GA).

    1.35/1.36 (``determineEffectiveRequests``): per container with ``status.resources``
    set, max(spec, actuated, allocated), then summed with the init/sidecar rule; plain
    init containers keep their spec. 1.37 (``aggregateContainerResourcesByFn``): three
    whole-pod aggregates (spec; allocated, falling back to spec; actuated, falling back to
    allocated, then spec), each with the init/sidecar rule, and their max; the pod-level
    status replaces the last two when both are reported. An infeasible resize drops the
    spec (1.37: also as the fallback of a container without status).
    """

    max_of_aggregates: bool
    pod_level_status: bool
    """``status.resources``/``status.allocatedResources`` count for pod-level resources
    (and, in 1.37, stand for the container aggregates)."""

    @classmethod
    def of(cls, kube_minor: int) -> StatusRules:
        return cls(
            max_of_aggregates=kube_minor >= MAX_OF_AGGREGATES_SINCE,
            pod_level_status=kube_minor >= POD_LEVEL_STATUS_SINCE,
        )


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


def _with_non_missing(
    requests: ResourceList | None, non_missing: ResourceList | None
) -> ResourceList:
    """``applyNonMissing``: a resource the container does not name counts as the default."""
    if not non_missing:
        return requests or {}
    out = dict(requests or {})
    for name, q in non_missing.items():
        if name not in out:
            out[name] = q
    return out


_ZERO: Final = Quantity.from_units(0)


def _max_of(*lists: ResourceList | None) -> dict[str, Quantity]:
    """Go's ``max(a, b...)`` of component-helpers: per resource, over the lists given."""
    out: dict[str, Quantity] = {}
    for other in lists:
        if other:
            _max_into(out, other)
    return out


Pick = Callable[[ContainerResources, bool], ResourceList | None]
"""A container's request list under one reading; the flag marks a plain init container."""


def _aggregate(
    inputs: RequestInputs, pick: Pick, non_missing: ResourceList | None
) -> dict[str, Quantity]:
    """The sidecar KEP's sum: containers and sidecars add up; each plain init container
    runs alone beside the sidecars started before it, so the pod needs the peak."""
    total: dict[str, Quantity] = {}
    for c in inputs.containers:
        _add(total, _with_non_missing(pick(c, False), non_missing))
    sidecars: dict[str, Quantity] = {}
    init_peak: dict[str, Quantity] = {}
    for c in inputs.init_containers:
        reqs = _with_non_missing(pick(c, not c.sidecar), non_missing)
        if c.sidecar:
            _add(total, reqs)
            _add(sidecars, reqs)
            _max_into(init_peak, sidecars)
        else:
            running = dict(reqs)
            _add(running, sidecars)
            _max_into(init_peak, running)
    _max_into(total, init_peak)
    return total


def _spec(c: ContainerResources, _init: bool) -> ResourceList:
    return c.requests


def _per_container(inputs: RequestInputs) -> Pick:
    """1.35/1.36 ``determineEffectiveRequests``, for containers and sidecars only."""
    infeasible = inputs.resize_infeasible

    def pick(c: ContainerResources, init: bool) -> ResourceList:
        if init or not c.reported:
            return c.requests
        if infeasible:
            return _max_of(c.actuated, c.allocated)
        return _max_of(c.requests, c.actuated, c.allocated)

    return pick


def _allocated(infeasible: bool) -> Pick:
    """1.37 ``containerAllocatedRequests``."""

    def pick(c: ContainerResources, _init: bool) -> ResourceList | None:
        if c.allocated is not None:
            return c.allocated
        return None if infeasible else c.requests

    return pick


def _actuated(infeasible: bool) -> Pick:
    """1.37 ``containerActuatedRequests``."""

    def pick(c: ContainerResources, _init: bool) -> ResourceList | None:
        if c.actuated is not None:
            return c.actuated
        if c.allocated is not None:
            return c.allocated
        return None if infeasible else c.requests

    return pick


def _container_requests(
    inputs: RequestInputs, rules: StatusRules, non_missing: ResourceList | None
) -> dict[str, Quantity]:
    if not rules.max_of_aggregates:
        return _aggregate(inputs, _per_container(inputs), non_missing)
    infeasible = inputs.resize_infeasible
    status = inputs.status
    if rules.pod_level_status and status.actuated is not None and status.allocated is not None:
        actuated, allocated = status.actuated, status.allocated
    else:
        allocated = _aggregate(inputs, _allocated(infeasible), non_missing)
        actuated = _aggregate(inputs, _actuated(infeasible), non_missing)
    if infeasible:
        return _max_of(actuated, allocated)
    return _max_of(_aggregate(inputs, _spec, non_missing), actuated, allocated)


def _apply_pod_level(
    total: dict[str, Quantity], inputs: RequestInputs, rules: StatusRules | None
) -> None:
    """Pod-level requests replace the container aggregate for cpu, memory and hugepages."""
    spec = inputs.pod_level
    if not any(is_pod_level_resource(n) for n in spec):
        return
    status = inputs.status
    if rules is None or not rules.pod_level_status or not status.reported:
        effective: ResourceList = spec
    else:
        base = None if inputs.resize_infeasible else spec
        effective = _max_of(base, status.actuated, status.allocated)
        if not rules.max_of_aggregates:
            # 1.36 walks the spec's names; one the status lacks becomes a zero Quantity.
            effective = {n: effective.get(n, _ZERO) for n in spec}
    for name, q in effective.items():
        if is_pod_level_resource(name):
            total[name] = q


def is_pod_level_resource(name: str) -> bool:
    return name in (CPU, MEMORY) or name.startswith(HUGEPAGES_PREFIX)


def pod_requests(
    inputs: RequestInputs,
    *,
    rules: StatusRules | None = None,
    non_missing: ResourceList | None = None,
) -> dict[str, Quantity]:
    """Exact effective requests of a pod (``resourcehelper.PodRequests``).

    ``rules`` None reads the spec only (``UseStatusResources`` off: NodeResourcesFit's
    PreFilter of a pod being scheduled); otherwise the status as that release reads it.
    """
    if rules is None or not inputs.status_matters:
        total = _aggregate(inputs, _spec, non_missing)
    else:
        total = _container_requests(inputs, rules, non_missing)
    _apply_pod_level(total, inputs, rules)
    if inputs.overhead:
        _add(total, inputs.overhead)
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

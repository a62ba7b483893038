"""The ``resource.k8s.io/v1`` objects the allocator reads, parsed once from API bodies.

Every record is immutable except a :class:`Device`'s verdict cache: selector verdicts (and
errors) per expression, kept on the device so they live exactly as long as the slice object
that brought it. A changed slice is parsed anew, which drops its cache with it.

Alpha fields (features kube-scheduler 1.34 keeps off) are parsed only far enough to say
which ones an object uses: :func:`claim_alpha_fields` names them for the Unsupported refusal;
devices and slices carrying them are handled as 1.34's allocator handles them with the gates
off (see :mod:`scheduler.core.dra.allocator`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from scheduler.core.dra.cel import (
    CelError,
    SelectorCompiler,
    Semver,
    quantity_value,
    semver_value,
    split_qualified_name,
)
from scheduler.model._fields import mapping, object_list, string, string_list
from scheduler.model.errors import InvalidObjectError
from scheduler.model.quantity import Quantity
from scheduler.model.selectors import NodeSelector

EXACT_COUNT: Final = "ExactCount"
ALL: Final = "All"
FROM_CLASS: Final = "FromClass"
FROM_CLAIM: Final = "FromClaim"
RESULTS_MAX: Final = 32
"""``AllocationResultsMaxSize``: devices per claim."""
DELETE_PROTECTION_FINALIZER: Final = "resource.kubernetes.io/delete-protection"
EXTENDED_RESOURCE_CLAIM_ANNOTATION: Final = "resource.kubernetes.io/extended-resource-claim"


class DeviceId(NamedTuple):
    driver: str
    pool: str
    device: str


class Attribute(NamedTuple):
    """One typed attribute value: ``kind`` is int, bool, string or version."""

    kind: str
    value: int | bool | str


_ATTRIBUTE_KINDS: Final = ("int", "bool", "string", "version")
# Device fields of alpha features (1.34 defaults drop them on write).
_DEVICE_ALPHA: Final = {
    "consumesCounters": "DRAPartitionableDevices",
    "nodeName": "DRAPartitionableDevices",
    "nodeSelector": "DRAPartitionableDevices",
    "allNodes": "DRAPartitionableDevices",
    "taints": "DRADeviceTaints",
    "bindsToNode": "DRADeviceBindingConditions",
    "bindingConditions": "DRADeviceBindingConditions",
    "bindingFailureConditions": "DRADeviceBindingConditions",
    "allowMultipleAllocations": "DRAConsumableCapacity",
}


def _attribute(raw: object, path: str) -> Attribute:
    body = mapping(raw, path)
    present = [k for k in _ATTRIBUTE_KINDS if body.get(k) is not None]
    if len(present) != 1:
        raise InvalidObjectError(
            path, raw, "an attribute needs exactly one of int, bool, string, version"
        )
    kind = present[0]
    value: int | bool | str = body[kind]
    expected: type = {"int": int, "bool": bool, "string": str, "version": str}[kind]
    if not isinstance(value, expected) or (kind == "int" and isinstance(value, bool)):
        raise InvalidObjectError(f"{path}.{kind}", value, f"must be a {kind}")
    return Attribute(kind, value)


@dataclass(eq=False, slots=True)
class Device:
    """One entry of ``ResourceSlice.spec.devices``."""

    name: str
    driver: str
    attributes: Mapping[str, Attribute]
    """By qualified name as written (bare names belong to the driver's domain)."""
    capacity: Mapping[str, Quantity]
    alpha_fields: tuple[str, ...] = ()
    """Alpha-feature fields the device carries (``consumesCounters``, ``taints``, ...)."""
    verdicts: dict[str, bool | CelError] = field(default_factory=dict)
    _cel_input: dict[str, Any] | CelError | None = None

    @property
    def allocatable(self) -> bool:
        """1.34 with default gates never allocates a device needing an alpha feature:
        ``consumesCounters`` and binding conditions are refused by its allocator; taints and
        per-device node selection are refused here too, so a cluster whose API server has
        those gates on cannot get a tainted or misplaced device from Lattice."""
        return not self.alpha_fields

    def attribute(self, qualified: str) -> Attribute | None:
        """matchAttribute's lookup: the exact name, else the bare id under the driver's
        domain only."""
        found = self.attributes.get(qualified)
        if found is not None:
            return found
        domain, sep, ident = qualified.partition("/")
        if sep and domain == self.driver:
            return self.attributes.get(ident)
        return None

    def cel_input(self) -> dict[str, Any]:
        """The ``device`` variable, built on first use (a bad version is a runtime error
        of every selector evaluated on this device, as in kube)."""
        if self._cel_input is None:
            try:
                self._cel_input = self._build_cel_input()
            except CelError as err:
                self._cel_input = err
        if isinstance(self._cel_input, CelError):
            raise self._cel_input
        return self._cel_input

    def _build_cel_input(self) -> dict[str, Any]:
        attributes: dict[str, dict[str, Any]] = {}
        for name, attr in self.attributes.items():
            domain, ident = split_qualified_name(name, self.driver)
            value: Any = attr.value
            if attr.kind == "version":
                value = semver_value(Semver.parse(str(attr.value)))
            attributes.setdefault(domain, {})[ident] = value
        capacity: dict[str, dict[str, Any]] = {}
        for name, q in self.capacity.items():
            domain, ident = split_qualified_name(name, self.driver)
            capacity.setdefault(domain, {})[ident] = quantity_value(q)
        return {"driver": self.driver, "attributes": attributes, "capacity": capacity}

    def matches(self, expression: str, compiler: SelectorCompiler) -> bool:
        """One selector's verdict, cached per expression; raises :class:`CelError`."""
        verdict = self.verdicts.get(expression)
        if verdict is None:
            compiler.evaluations += 1
            try:
                verdict = compiler.compile(expression).evaluate(self.cel_input())
            except CelError as err:
                verdict = err
            self.verdicts[expression] = verdict
        if isinstance(verdict, CelError):
            raise verdict
        return verdict

    @classmethod
    def from_api(cls, raw: object, *, driver: str, path: str) -> Device:
        body = mapping(raw, path)
        attributes = {
            str(k): _attribute(v, f"{path}.attributes[{k}]")
            for k, v in mapping(body.get("attributes"), f"{path}.attributes").items()
        }
        capacity = {
            str(k): Quantity.parse(
                mapping(v, f"{path}.capacity[{k}]").get("value"),
                field=f"{path}.capacity[{k}].value",
            )
            for k, v in mapping(body.get("capacity"), f"{path}.capacity").items()
        }
        alpha = tuple(f for f in _DEVICE_ALPHA if body.get(f) not in (None, False, [], {}, ""))
        return cls(
            name=string(body.get("name"), f"{path}.name"),
            driver=driver,
            attributes=attributes,
            capacity=capacity,
            alpha_fields=alpha,
        )


@dataclass(frozen=True, slots=True)
class ResourceSlice:
    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    node_name: str = ""
    node_selector: NodeSelector | None = None
    raw_node_selector: Mapping[str, Any] | None = None
    """``spec.nodeSelector`` as written (copied into allocations' node selectors)."""
    all_nodes: bool = False
    per_device_node_selection: bool = False
    devices: tuple[Device, ...] = ()

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> ResourceSlice:
        meta = mapping(body.get("metadata"), "metadata")
        spec = mapping(body.get("spec"), "spec")
        pool = mapping(spec.get("pool"), "spec.pool")
        driver = string(spec.get("driver"), "spec.driver")
        raw_selector = spec.get("nodeSelector")
        selector = (
            None
            if raw_selector is None
            else NodeSelector.from_api(raw_selector, field="spec.nodeSelector")
        )
        return cls(
            name=string(meta.get("name"), "metadata.name"),
            driver=driver,
            pool=string(pool.get("name"), "spec.pool.name"),
            generation=_int64(pool.get("generation"), "spec.pool.generation"),
            slice_count=_int64(pool.get("resourceSliceCount"), "spec.pool.resourceSliceCount"),
            node_name=string(spec.get("nodeName"), "spec.nodeName"),
            node_selector=selector,
            raw_node_selector=mapping(raw_selector, "spec.nodeSelector") if raw_selector else None,
            all_nodes=spec.get("allNodes") is True,
            per_device_node_selection=spec.get("perDeviceNodeSelection") is True,
            devices=tuple(
                Device.from_api(d, driver=driver, path=f"spec.devices[{i}]")
                for i, d in enumerate(object_list(spec.get("devices"), "spec.devices"))
            ),
        )


def _int64(raw: object, path: str) -> int:
    if raw is None:
        return 0
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise InvalidObjectError(path, raw, "must be an integer")
    return raw


def _timestamp(raw: object, path: str) -> float:
    """An RFC 3339 time as POSIX seconds (absent: 0)."""
    text = string(raw, path)
    if not text:
        return 0.0
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError as exc:
        raise InvalidObjectError(path, raw, "must be an RFC 3339 time") from exc


def _selectors(raw: object, path: str) -> tuple[str | None, ...]:
    """CEL expressions; None for a selector of a type this version does not know."""
    out: list[str | None] = []
    for i, s in enumerate(object_list(raw, path)):
        cel_body = s.get("cel")
        if cel_body is None:
            out.append(None)
            continue
        out.append(
            string(
                mapping(cel_body, f"{path}[{i}].cel").get("expression"),
                f"{path}[{i}].cel.expression",
            )
        )
    return tuple(out)


@dataclass(frozen=True, slots=True)
class DeviceClass:
    name: str
    selectors: tuple[str | None, ...] = ()
    config: tuple[Mapping[str, Any], ...] = ()
    """``spec.config[]`` entries (each holds ``opaque``), copied into allocations."""
    extended_resource_name: str = ""
    created: float = 0.0
    """``metadata.creationTimestamp`` in POSIX seconds: of two classes naming one extended
    resource, the newer serves it (kube's extended resource cache)."""

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> DeviceClass:
        meta = mapping(body.get("metadata"), "metadata")
        spec = mapping(body.get("spec"), "spec")
        return cls(
            name=string(meta.get("name"), "metadata.name"),
            created=_timestamp(meta.get("creationTimestamp"), "metadata.creationTimestamp"),
            selectors=_selectors(spec.get("selectors"), "spec.selectors"),
            config=tuple(object_list(spec.get("config"), "spec.config")),
            extended_resource_name=string(
                spec.get("extendedResourceName"), "spec.extendedResourceName"
            ),
        )


@dataclass(frozen=True, slots=True)
class ExactRequest:
    """``exactly`` of a request, or one ``firstAvailable`` subrequest (``name`` set)."""

    device_class: str
    selectors: tuple[str | None, ...] = ()
    mode: str = EXACT_COUNT
    count: int = 1
    admin_access: bool | None = None
    name: str = ""
    alpha_fields: tuple[str, ...] = ()

    @classmethod
    def from_api(cls, raw: object, path: str, *, name: str = "") -> ExactRequest:
        body = mapping(raw, path)
        mode = string(body.get("allocationMode"), f"{path}.allocationMode", EXACT_COUNT)
        count = _int64(body.get("count"), f"{path}.count")
        if mode == EXACT_COUNT and body.get("count") is None:
            count = 1
        admin = body.get("adminAccess")
        if admin is not None and not isinstance(admin, bool):
            raise InvalidObjectError(f"{path}.adminAccess", admin, "must be a boolean")
        alpha = tuple(
            f"{path}.{f}" for f in ("tolerations", "capacity") if body.get(f) not in (None, [], {})
        )
        return cls(
            device_class=string(body.get("deviceClassName"), f"{path}.deviceClassName"),
            selectors=_selectors(body.get("selectors"), f"{path}.selectors"),
            mode=mode,
            count=count,
            admin_access=admin,
            name=name,
            alpha_fields=alpha,
        )


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    name: str
    exactly: ExactRequest | None = None
    first_available: tuple[ExactRequest, ...] = ()


@dataclass(frozen=True, slots=True)
class Constraint:
    requests: tuple[str, ...] = ()
    match_attribute: str | None = None
    distinct_attribute: str | None = None


@dataclass(frozen=True, slots=True)
class ClaimConfig:
    requests: tuple[str, ...]
    body: Mapping[str, Any]
    """The entry as written (``requests`` plus ``opaque``)."""


@dataclass(frozen=True, slots=True)
class ReservedFor:
    name: str
    uid: str
    resource: str = "pods"
    api_group: str = ""


@dataclass(frozen=True, slots=True)
class ResourceClaim:
    namespace: str
    name: str
    uid: str = ""
    resource_version: str = ""
    requests: tuple[DeviceRequest, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    config: tuple[ClaimConfig, ...] = ()
    allocation: Mapping[str, Any] | None = None
    """``status.allocation`` as written, None while unallocated."""
    allocation_node_selector: NodeSelector | None = None
    reserved_for: tuple[ReservedFor, ...] = ()
    deleting: bool = False
    finalizers: tuple[str, ...] = ()
    controller_uid: str = ""
    """The ownerReference with ``controller: true`` (a pod, for generated claims)."""
    controller_name: str = ""
    extended_resources: bool = False
    """Annotated ``resource.kubernetes.io/extended-resource-claim: "true"``: the claim the
    scheduler made for a pod's DRA-backed extended resources (DRAExtendedResource)."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def allocated_devices(self) -> list[DeviceId]:
        """Devices this claim holds, adminAccess results excluded (they do not use them up)."""
        if self.allocation is None:
            return []
        results = object_list(
            mapping(self.allocation.get("devices"), "status.allocation.devices").get("results"),
            "status.allocation.devices.results",
        )
        return [
            DeviceId(str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", "")))
            for r in results
            if r.get("adminAccess") is not True
        ]

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> ResourceClaim:
        meta = mapping(body.get("metadata"), "metadata")
        spec = mapping(body.get("spec"), "spec")
        devices = mapping(spec.get("devices"), "spec.devices")
        status = mapping(body.get("status"), "status")
        requests: list[DeviceRequest] = []
        for i, r in enumerate(object_list(devices.get("requests"), "spec.devices.requests")):
            path = f"spec.devices.requests[{i}]"
            name = string(r.get("name"), f"{path}.name")
            exactly = (
                None
                if r.get("exactly") is None
                else ExactRequest.from_api(r["exactly"], f"{path}.exactly")
            )
            subs = tuple(
                ExactRequest.from_api(
                    s,
                    f"{path}.firstAvailable[{j}]",
                    name=string(s.get("name"), f"{path}.firstAvailable[{j}].name"),
                )
                for j, s in enumerate(
                    object_list(r.get("firstAvailable"), f"{path}.firstAvailable")
                )
            )
            requests.append(DeviceRequest(name, exactly, subs))
        constraints = tuple(
            Constraint(
                requests=string_list(c.get("requests"), f"spec.devices.constraints[{i}].requests"),
                match_attribute=c.get("matchAttribute"),
                distinct_attribute=c.get("distinctAttribute"),
            )
            for i, c in enumerate(
                object_list(devices.get("constraints"), "spec.devices.constraints")
            )
        )
        config = tuple(
            ClaimConfig(string_list(c.get("requests"), f"spec.devices.config[{i}].requests"), c)
            for i, c in enumerate(object_list(devices.get("config"), "spec.devices.config"))
        )
        allocation = status.get("allocation")
        selector = None
        if allocation is not None:
            raw_selector = mapping(allocation, "status.allocation").get("nodeSelector")
            if raw_selector is not None:
                selector = NodeSelector.from_api(
                    raw_selector, field="status.allocation.nodeSelector"
                )
        reserved = tuple(
            ReservedFor(
                name=string(r.get("name"), "status.reservedFor.name"),
                uid=string(r.get("uid"), "status.reservedFor.uid"),
                resource=string(r.get("resource"), "status.reservedFor.resource"),
                api_group=string(r.get("apiGroup"), "status.reservedFor.apiGroup"),
            )
            for r in object_list(status.get("reservedFor"), "status.reservedFor")
        )
        controller = next(
            (
                (
                    string(o.get("uid"), "metadata.ownerReferences.uid"),
                    string(o.get("name"), "metadata.ownerReferences.name"),
                )
                for o in object_list(meta.get("ownerReferences"), "metadata.ownerReferences")
                if o.get("controller") is True
            ),
            ("", ""),
        )
        annotations = mapping(meta.get("annotations"), "metadata.annotations")
        return cls(
            namespace=string(meta.get("namespace"), "metadata.namespace"),
            name=string(meta.get("name"), "metadata.name"),
            uid=string(meta.get("uid"), "metadata.uid"),
            resource_version=string(meta.get("resourceVersion"), "metadata.resourceVersion"),
            requests=tuple(requests),
            constraints=constraints,
            config=config,
            allocation=None if allocation is None else mapping(allocation, "status.allocation"),
            allocation_node_selector=selector,
            reserved_for=reserved,
            deleting=meta.get("deletionTimestamp") is not None,
            finalizers=string_list(meta.get("finalizers"), "metadata.finalizers"),
            controller_uid=controller[0],
            controller_name=controller[1],
            extended_resources=annotations.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true",
        )


def claim_alpha_fields(claim: ResourceClaim) -> list[str]:
    """The alpha-feature fields a claim uses, as paths (empty: 1.34 defaults suffice)."""
    out: list[str] = []
    for request in claim.requests:
        for exact in (request.exactly, *request.first_available):
            if exact is not None:
                out.extend(exact.alpha_fields)
    out.extend(
        f"spec.devices.constraints[{i}].distinctAttribute"
        for i, c in enumerate(claim.constraints)
        if c.distinct_attribute is not None
    )
    return out


def requests_of(claims: Sequence[ResourceClaim]) -> list[str]:
    """Device class names the claims' requests name (for the missing-class check)."""
    names: list[str] = []
    for claim in claims:
        for request in claim.requests:
            for exact in (request.exactly, *request.first_available):
                if exact is not None and exact.device_class not in names:
                    names.append(exact.device_class)
    return names

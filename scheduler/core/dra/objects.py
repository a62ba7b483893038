"""The ``resource.k8s.io/v1`` objects the allocator reads, parsed once from API bodies.

Every record is immutable except a :class:`Device`'s verdict cache: selector verdicts (and
errors) per expression, kept on the device so they live exactly as long as the slice object
that brought it. A changed slice is parsed anew, which drops its cache with it.

Fields of the feature Lattice does not implement yet (binding conditions: beta and on in
kube 1.36+) are parsed only far enough to say which ones a device uses; devices carrying
them are never allocated (kube's allocator with the gate off), so Lattice never hands out a
device it cannot account for.

Consumable capacity (DRAConsumableCapacity, alpha in 1.35, beta and on from 1.36) is parsed
whole: a device's ``allowMultipleAllocations`` and each capacity's ``requestPolicy``, a
request's ``capacity.requests``, a constraint's ``distinctAttribute`` and a result's
``shareID`` and ``consumedCapacity`` (exact, in nanounits). On 1.35 (gate off)
:func:`claim_alpha_fields` names a claim's fields for the Unsupported refusal and a device
allowing multiple allocations is never allocated; from 1.36 the allocator serves them.

Partitionable devices (DRAPartitionableDevices, alpha in 1.35, beta and on from 1.36) are
parsed whole: a slice's ``sharedCounters``, a device's ``consumesCounters`` and its own
``nodeName``/``nodeSelector``/``allNodes``. Counter values are kept exact, in nanounits.
Whether they are allocated is the allocator's decision, by release.

Device taints (DRADeviceTaints, GA in 1.37, beta and on in 1.36) are parsed whole: a
device's ``taints``, a request's ``tolerations`` and the cluster's DeviceTaintRules, whose
taint kube-scheduler adds to every device its ``deviceSelector`` names. An API server with
the gate off (1.35's default) drops both fields on write, so reading what is there follows
the release without a switch.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
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
from scheduler.model.selectors import Labels, NodeSelector

EXACT_COUNT: Final = "ExactCount"
ALL: Final = "All"
FROM_CLASS: Final = "FromClass"
FROM_CLAIM: Final = "FromClaim"
RESULTS_MAX: Final = 32
VERDICTS_PER_DEVICE: Final = 256
"""Selector verdicts a device keeps: each claim may bring selectors of its own, and a
device lives as long as its slice."""
"""``AllocationResultsMaxSize``: devices per claim."""
FIRST_AVAILABLE_MAX: Final = 8
"""``FirstAvailableDeviceRequestMaxSize``: subrequests per request (the API server refuses
more), and the base of kube's prioritized-list score (8 - index of the chosen one)."""
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


NO_SCHEDULE: Final = "NoSchedule"
NO_EXECUTE: Final = "NoExecute"
_BLOCKING_EFFECTS: Final = frozenset({NO_SCHEDULE, NO_EXECUTE})
EQUAL: Final = "Equal"
EXISTS: Final = "Exists"


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    """One ``DeviceTaint``, of a device or of a DeviceTaintRule."""

    key: str
    value: str = ""
    effect: str = ""
    time_added: str | None = None
    """``timeAdded`` as written (the eviction controller's clock; never read here)."""

    @property
    def blocks(self) -> bool:
        """Only NoSchedule and NoExecute keep a device from a claim: ``None`` and effects
        this release does not know are informational (kube: "treat unknown effects like
        None")."""
        return self.effect in _BLOCKING_EFFECTS

    def __str__(self) -> str:
        """kube's ``DeviceTaint.String``: ``key=value:Effect``."""
        value = f"={self.value}" if self.value else ""
        if not self.effect:
            return f"{self.key}{value}{':' if value else ''}"
        return f"{self.key}{value}:{self.effect}"

    @classmethod
    def from_api(cls, raw: object, path: str) -> DeviceTaint:
        body = mapping(raw, path)
        time_added = body.get("timeAdded")
        return cls(
            key=string(body.get("key"), f"{path}.key"),
            value=string(body.get("value"), f"{path}.value"),
            effect=string(body.get("effect"), f"{path}.effect"),
            time_added=None if time_added is None else string(time_added, f"{path}.timeAdded"),
        )


@dataclass(frozen=True, slots=True)
class DeviceToleration:
    """One ``DeviceToleration`` of a request."""

    key: str = ""
    operator: str = ""
    value: str = ""
    effect: str = ""
    seconds: int | None = None
    """``tolerationSeconds``: only the eviction of running pods reads it, never allocation;
    kept because every allocation result carries a copy of its request's tolerations."""

    def tolerates(self, taint: DeviceTaint) -> bool:
        """kube's ``resourceclaim.ToleratesTaint``: an empty effect or key matches any; an
        operator other than Equal (the default) or Exists tolerates nothing."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator in ("", EQUAL):
            return self.value == taint.value
        return self.operator == EXISTS

    def to_api(self) -> dict[str, Any]:
        """The JSON kube writes into ``results[].tolerations`` (empty fields omitted)."""
        body: dict[str, Any] = {
            k: v
            for k, v in (
                ("key", self.key),
                ("operator", self.operator),
                ("value", self.value),
                ("effect", self.effect),
            )
            if v
        }
        if self.seconds is not None:
            body["tolerationSeconds"] = self.seconds
        return body

    @classmethod
    def from_api(cls, raw: object, path: str) -> DeviceToleration:
        body = mapping(raw, path)
        seconds = body.get("tolerationSeconds")
        return cls(
            key=string(body.get("key"), f"{path}.key"),
            # The API server defaults an empty operator to Equal; kept as written.
            operator=string(body.get("operator"), f"{path}.operator"),
            value=string(body.get("value"), f"{path}.value"),
            effect=string(body.get("effect"), f"{path}.effect"),
            seconds=None if seconds is None else _int64(seconds, f"{path}.tolerationSeconds"),
        )


def untolerated(
    taints: Sequence[DeviceTaint], tolerations: Sequence[DeviceToleration]
) -> list[DeviceTaint]:
    """The taints that keep a device from a request with ``tolerations`` (kube's
    ``taintPreventsAllocation``, every blocking taint rather than the first)."""
    return [t for t in taints if t.blocks and not any(o.tolerates(t) for o in tolerations)]


@dataclass(frozen=True, slots=True)
class DeviceTaintRule:
    """A ``DeviceTaintRule`` (``resource.k8s.io/v1``, 1.37): its taint on every device its
    selector names."""

    name: str
    taint: DeviceTaint
    selects: bool = False
    """Whether ``spec.deviceSelector`` is set at all: without one the rule matches no
    device (1.37.1, #141998; before, every device). An empty one matches every device."""
    driver: str | None = None
    pool: str | None = None
    device: str | None = None

    def matches_pool(self, driver: str, pool: str) -> bool:
        return self.selects and self.driver in (None, driver) and self.pool in (None, pool)

    def matches(self, driver: str, pool: str, device: str) -> bool:
        return self.matches_pool(driver, pool) and self.device in (None, device)

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> DeviceTaintRule:
        meta = mapping(body.get("metadata"), "metadata")
        spec = mapping(body.get("spec"), "spec")
        raw_selector = spec.get("deviceSelector")
        selector = mapping(raw_selector, "spec.deviceSelector")

        def part(name: str) -> str | None:
            value = selector.get(name)
            return None if value is None else string(value, f"spec.deviceSelector.{name}")

        return cls(
            name=string(meta.get("name"), "metadata.name"),
            taint=DeviceTaint.from_api(spec.get("taint"), "spec.taint"),
            selects=raw_selector is not None,
            driver=part("driver"),
            pool=part("pool"),
            device=part("device"),
        )


_ATTRIBUTE_KINDS: Final = ("int", "bool", "string", "version")
# Device fields of DRADeviceBindingConditions (off in 1.35, whose API server drops them):
# such a device is allocated from 1.36 only (:meth:`Device.allocatable`).
_DEVICE_ALPHA: Final = {
    "bindsToNode": "DRADeviceBindingConditions",
    "bindingConditions": "DRADeviceBindingConditions",
    "bindingFailureConditions": "DRADeviceBindingConditions",
}
BINDING_CONDITIONS_SINCE_MINOR: Final = 36
"""DRADeviceBindingConditions (and DRAResourceClaimDeviceStatus) beta and on in
kube-scheduler from 1.36: devices with binding conditions are allocated, and PreBind waits
for their conditions."""
CONSUMABLE_CAPACITY_SINCE_MINOR: Final = 36
"""DRAConsumableCapacity is beta and on in kube-scheduler from 1.36 (alpha, off, in 1.35)."""


def _nanos(raw: object, path: str) -> int:
    return Quantity.parse(raw, field=path).nanos


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """A capacity's ``requestPolicy`` in nanounits: how a request is rounded and bounded
    (kube's ``calculateConsumedCapacity`` and ``violatesPolicy``)."""

    default: int | None = None
    has_range: bool = False
    """``validRange`` is set (then ``valid_values`` is not: the API allows one of them)."""
    min: int | None = None
    max: int | None = None
    step: int | None = None
    valid_values: tuple[int, ...] = ()

    @classmethod
    def from_api(cls, raw: object, path: str) -> RequestPolicy:
        body = mapping(raw, path)

        def opt(holder: Mapping[str, Any], name: str, where: str) -> int | None:
            value = holder.get(name)
            return None if value is None else _nanos(value, f"{where}.{name}")

        rng = body.get("validRange")
        bounds = mapping(rng, f"{path}.validRange")
        where = f"{path}.validRange"
        return cls(
            default=opt(body, "default", path),
            has_range=rng is not None,
            min=opt(bounds, "min", where),
            max=opt(bounds, "max", where),
            step=opt(bounds, "step", where),
            valid_values=tuple(
                _nanos(v, f"{path}.validValues[{i}]")
                for i, v in enumerate(_plain_list(body.get("validValues"), f"{path}.validValues"))
            ),
        )


def _plain_list(raw: object, path: str) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidObjectError(path, raw, "must be a list")
    return raw


class Share(NamedTuple):
    """One result of an allocation on a device allowing multiple allocations: the capacity
    it consumes (nanounits by capacity name), counted against the device's."""

    device: DeviceId
    consumed: Mapping[str, int]


def allocation_usage(
    allocation: Mapping[str, Any] | None,
) -> tuple[list[DeviceId], list[Share]]:
    """The devices an allocation holds alone and its shares of multi-allocatable devices
    (kube's ``foreachAllocatedDevice``: a result with ``shareID`` is a share, adminAccess
    results hold nothing)."""
    if allocation is None:
        return [], []
    results = object_list(
        mapping(allocation.get("devices"), "status.allocation.devices").get("results"),
        "status.allocation.devices.results",
    )
    dedicated: list[DeviceId] = []
    shares: list[Share] = []
    for i, r in enumerate(results):
        if r.get("adminAccess") is True:
            continue
        device = DeviceId(
            str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", ""))
        )
        if r.get("shareID") is None:
            dedicated.append(device)
            continue
        path = f"status.allocation.devices.results[{i}].consumedCapacity"
        consumed = {
            str(k): _nanos(v, f"{path}[{k}]")
            for k, v in mapping(r.get("consumedCapacity"), path).items()
        }
        shares.append(Share(device, consumed))
    return dedicated, shares


Counters = Mapping[str, int]
"""Counter name -> value in nanounits (exact, as kube's ``resource.Quantity``)."""


def _counters(raw: object, path: str) -> dict[str, int]:
    return {
        str(k): Quantity.parse(
            mapping(v, f"{path}[{k}]").get("value"), field=f"{path}[{k}].value"
        ).nanos
        for k, v in mapping(raw, path).items()
    }


@dataclass(frozen=True, slots=True)
class CounterSet:
    """One entry of ``ResourceSlice.spec.sharedCounters``."""

    name: str
    counters: Counters

    @classmethod
    def from_api(cls, raw: object, path: str) -> CounterSet:
        body = mapping(raw, path)
        return cls(
            name=string(body.get("name"), f"{path}.name"),
            counters=_counters(body.get("counters"), f"{path}.counters"),
        )


@dataclass(frozen=True, slots=True)
class CounterConsumption:
    """One entry of a device's ``consumesCounters``."""

    counter_set: str
    counters: Counters

    @classmethod
    def from_api(cls, raw: object, path: str) -> CounterConsumption:
        body = mapping(raw, path)
        return cls(
            counter_set=string(body.get("counterSet"), f"{path}.counterSet"),
            counters=_counters(body.get("counters"), f"{path}.counters"),
        )


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
    """Fields of DRADeviceBindingConditions the device sets (``bindingConditions``, ...)."""
    binding_conditions: tuple[str, ...] = ()
    """``bindingConditions``: condition types that must be True in the claim's
    ``status.devices`` entry before the pod is bound (copied into the allocation)."""
    binding_failure_conditions: tuple[str, ...] = ()
    """``bindingFailureConditions``: any of them True fails the binding."""
    binds_to_node: bool = False
    """``bindsToNode``: the allocation is pinned to the chosen node by name."""
    consumes: tuple[CounterConsumption, ...] = ()
    """``consumesCounters`` (DRAPartitionableDevices)."""
    node_name: str = ""
    node_selector: NodeSelector | None = None
    raw_node_selector: Mapping[str, Any] | None = None
    all_nodes: bool = False
    """The device's own node selection, read where its slice has ``perDeviceNodeSelection``."""
    taints: tuple[DeviceTaint, ...] = ()
    """The slice's taints, then those of matching DeviceTaintRules (:meth:`tainted`)."""
    multiple: bool = False
    """``allowMultipleAllocations`` (DRAConsumableCapacity): shares of its capacity go to
    several requests and claims."""
    policies: Mapping[str, RequestPolicy] = field(default_factory=dict)
    """Each capacity's ``requestPolicy``, where it has one."""
    verdicts: dict[str, bool | CelError] = field(default_factory=dict)
    _cel_input: dict[str, Any] | CelError | None = None

    def allocatable(self, kube_minor: int) -> bool:
        """A device with binding fields is handed out from 1.36 only (kube's stable
        allocator, gate off, passes over one with ``bindingConditions``; the 1.35 API
        server drops the fields of any object written since)."""
        return kube_minor >= BINDING_CONDITIONS_SINCE_MINOR or not self.alpha_fields

    @property
    def own_node_selection(self) -> bool:
        return bool(self.node_name or self.node_selector is not None or self.all_nodes)

    def on_node(self, labels: Labels, node: str) -> bool:
        """kube's ``NodeMatches`` for the device's own fields (none set: no node)."""
        if self.node_name:
            return self.node_name == node
        if self.all_nodes:
            return True
        return self.node_selector is not None and self.node_selector.matches(labels, node)

    @property
    def blocking_taints(self) -> bool:
        """Whether some taint keeps the device from requests that do not tolerate it."""
        return any(t.blocks for t in self.taints)

    def tainted(self, extra: Sequence[DeviceTaint]) -> Device:
        """This device with ``extra`` taints appended (kube's slice tracker patches a copy
        the same way). The verdict cache is shared: selectors never see taints."""
        return replace(self, taints=self.taints + tuple(extra))

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
        return {
            "driver": self.driver,
            "allowMultipleAllocations": self.multiple,
            "attributes": attributes,
            "capacity": capacity,
        }

    def matches(self, expression: str, compiler: SelectorCompiler) -> bool:
        """One selector's verdict, cached per expression; raises :class:`CelError`."""
        verdict = self.verdicts.get(expression)
        if verdict is None:
            compiler.evaluations += 1
            try:
                verdict = compiler.compile(expression).evaluate(self.cel_input())
            except CelError as err:
                verdict = err
            if len(self.verdicts) >= VERDICTS_PER_DEVICE:
                # The oldest verdict goes (best effort: the off-loop search may be reading).
                with contextlib.suppress(RuntimeError, KeyError, StopIteration):
                    del self.verdicts[next(iter(self.verdicts))]
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
        policies = {
            str(k): RequestPolicy.from_api(
                v["requestPolicy"], f"{path}.capacity[{k}].requestPolicy"
            )
            for k, v in mapping(body.get("capacity"), f"{path}.capacity").items()
            if isinstance(v, Mapping) and v.get("requestPolicy") is not None
        }
        raw_selector = body.get("nodeSelector")
        return cls(
            name=string(body.get("name"), f"{path}.name"),
            driver=driver,
            attributes=attributes,
            capacity=capacity,
            alpha_fields=alpha,
            binding_conditions=string_list(
                body.get("bindingConditions"), f"{path}.bindingConditions"
            ),
            binding_failure_conditions=string_list(
                body.get("bindingFailureConditions"), f"{path}.bindingFailureConditions"
            ),
            binds_to_node=body.get("bindsToNode") is True,
            multiple=body.get("allowMultipleAllocations") is True,
            policies=policies,
            consumes=tuple(
                CounterConsumption.from_api(c, f"{path}.consumesCounters[{i}]")
                for i, c in enumerate(
                    object_list(body.get("consumesCounters"), f"{path}.consumesCounters")
                )
            ),
            node_name=string(body.get("nodeName"), f"{path}.nodeName"),
            node_selector=None
            if raw_selector is None
            else NodeSelector.from_api(raw_selector, field=f"{path}.nodeSelector"),
            raw_node_selector=mapping(raw_selector, f"{path}.nodeSelector")
            if raw_selector
            else None,
            all_nodes=body.get("allNodes") is True,
            taints=tuple(
                DeviceTaint.from_api(t, f"{path}.taints[{i}]")
                for i, t in enumerate(object_list(body.get("taints"), f"{path}.taints"))
            ),
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
    shared_counters: tuple[CounterSet, ...] = ()

    def tainted_by(self, rules: Sequence[DeviceTaintRule]) -> ResourceSlice:
        """The slice as kube-scheduler sees it: each rule's taint appended to the devices
        it matches, rules in the given order (itself when none matches)."""
        devices = list(self.devices)
        changed = False
        for rule in rules:
            if not rule.matches_pool(self.driver, self.pool):
                continue
            for i, d in enumerate(devices):
                if rule.device in (None, d.name):
                    devices[i] = d.tainted((rule.taint,))
                    changed = True
        return replace(self, devices=tuple(devices)) if changed else self

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
            shared_counters=tuple(
                CounterSet.from_api(c, f"spec.sharedCounters[{i}]")
                for i, c in enumerate(
                    object_list(spec.get("sharedCounters"), "spec.sharedCounters")
                )
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
    """Fields of DRAConsumableCapacity (``capacity``), refused on 1.35 where it is off."""
    tolerations: tuple[DeviceToleration, ...] = ()
    capacity: tuple[tuple[str, int], ...] | None = None
    """``capacity.requests``: (capacity name, nanounits), sorted (None: not set). A tuple,
    so a request stays hashable (claim specs key the allocator's memo)."""

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
        alpha = tuple(f"{path}.{f}" for f in ("capacity",) if body.get(f) not in (None, [], {}))
        raw_capacity = body.get("capacity")
        capacity = None
        if raw_capacity is not None:
            where = f"{path}.capacity.requests"
            capacity = tuple(
                sorted(
                    (str(k), _nanos(v, f"{where}[{k}]"))
                    for k, v in mapping(
                        mapping(raw_capacity, f"{path}.capacity").get("requests"), where
                    ).items()
                )
            )
        return cls(
            capacity=capacity,
            device_class=string(body.get("deviceClassName"), f"{path}.deviceClassName"),
            selectors=_selectors(body.get("selectors"), f"{path}.selectors"),
            mode=mode,
            count=count,
            admin_access=admin,
            name=name,
            alpha_fields=alpha,
            tolerations=tuple(
                DeviceToleration.from_api(t, f"{path}.tolerations[{i}]")
                for i, t in enumerate(object_list(body.get("tolerations"), f"{path}.tolerations"))
            ),
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
    device_statuses: tuple[Mapping[str, Any], ...] = ()
    """``status.devices`` as written (DRAResourceClaimDeviceStatus): the drivers'
    conditions per allocated device, where binding conditions are read
    (:mod:`scheduler.core.dra.binding`)."""
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
        """Devices this claim holds alone, adminAccess results excluded (they do not use
        them up) and shares of multi-allocatable devices too (:meth:`allocated_shares`)."""
        return allocation_usage(self.allocation)[0]

    def allocated_shares(self) -> list[Share]:
        """The capacity this claim's results consume of multi-allocatable devices."""
        return allocation_usage(self.allocation)[1]

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
            device_statuses=tuple(object_list(status.get("devices"), "status.devices")),
            deleting=meta.get("deletionTimestamp") is not None,
            finalizers=string_list(meta.get("finalizers"), "metadata.finalizers"),
            controller_uid=controller[0],
            controller_name=controller[1],
            extended_resources=annotations.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true",
        )


def claim_alpha_fields(claim: ResourceClaim, kube_minor: int) -> list[str]:
    """The fields of DRA features off in release ``kube_minor`` a claim uses, as paths
    (DRAConsumableCapacity's ``capacity`` and ``distinctAttribute`` before 1.36)."""
    if kube_minor >= CONSUMABLE_CAPACITY_SINCE_MINOR:
        return []
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

"""Small builders for DRA API bodies (resource.k8s.io/v1 shapes) used by the DRA tests."""

from __future__ import annotations

from typing import Any

GPU_DRIVER = "gpu.example.com"
NIC_DRIVER = "nic.example.com"


def attr(value: int | bool | str, *, version: bool = False) -> dict[str, Any]:
    if version:
        return {"version": value}
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


def device(
    name: str, *, capacity: dict[str, str] | None = None, **attributes: Any
) -> dict[str, Any]:
    """A device; ``attributes`` values are plain (typed by Python type) or attr() bodies;
    qualified names (``resource.kubernetes.io/pcieRoot``) go in ``qualified={...}``."""
    qualified = attributes.pop("qualified", {})
    body: dict[str, Any] = {
        "name": name,
        "attributes": {
            **{k: v if isinstance(v, dict) else attr(v) for k, v in attributes.items()},
            **{k: v if isinstance(v, dict) else attr(v) for k, v in qualified.items()},
        },
    }
    if capacity:
        body["capacity"] = {k: {"value": v} for k, v in capacity.items()}
    return body


def resource_slice(
    name: str,
    devices: list[dict[str, Any]],
    *,
    node: str | None = None,
    driver: str = GPU_DRIVER,
    pool: str | None = None,
    generation: int = 1,
    count: int = 1,
    all_nodes: bool = False,
    node_selector: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {
            "name": pool or node or name,
            "generation": generation,
            "resourceSliceCount": count,
        },
        "devices": devices,
    }
    if node is not None:
        spec["nodeName"] = node
    if all_nodes:
        spec["allNodes"] = True
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": spec,
    }


def device_class(
    name: str, *expressions: str, driver: str | None = GPU_DRIVER, config: list[Any] | None = None
) -> dict[str, Any]:
    selectors = [{"cel": {"expression": e}} for e in expressions]
    if driver is not None:
        selectors.insert(0, {"cel": {"expression": f'device.driver == "{driver}"'}})
    spec: dict[str, Any] = {"selectors": selectors}
    if config is not None:
        spec["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def exactly(
    device_class: str,
    *selectors: str,
    count: int | None = None,
    mode: str | None = None,
    admin: bool | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": device_class}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if count is not None:
        body["count"] = count
    if mode is not None:
        body["allocationMode"] = mode
    if admin is not None:
        body["adminAccess"] = admin
    return body


def claim(
    name: str,
    *requests: dict[str, Any],
    namespace: str = "default",
    constraints: list[dict[str, Any]] | None = None,
    config: list[dict[str, Any]] | None = None,
    uid: str = "",
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"},
        "spec": {"devices": devices},
    }
    if status is not None:
        body["status"] = status
    return body


def request(name: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "exactly": body}


def first_available(name: str, *subs: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "firstAvailable": [{"name": n, **b} for n, b in subs]}


def opaque(driver: str, **parameters: Any) -> dict[str, Any]:
    return {"opaque": {"driver": driver, "parameters": parameters}}


def taint(key: str, effect: str = "NoSchedule", value: str = "") -> dict[str, Any]:
    body = {"key": key, "effect": effect}
    if value:
        body["value"] = value
    return body


def toleration(
    key: str = "",
    *,
    operator: str = "Equal",
    value: str = "",
    effect: str = "",
    seconds: int | None = None,
) -> dict[str, Any]:
    """A toleration as the API server stores it (operator defaulted to Equal)."""
    body: dict[str, Any] = {"operator": operator}
    for name, field in (("key", key), ("value", value), ("effect", effect)):
        if field:
            body[name] = field
    if seconds is not None:
        body["tolerationSeconds"] = seconds
    return body


def tainted(body: dict[str, Any], *taints: dict[str, Any]) -> dict[str, Any]:
    """A device with taints."""
    return {**body, "taints": list(taints)}


def tolerating(body: dict[str, Any], *tolerations: dict[str, Any]) -> dict[str, Any]:
    """An ``exactly`` or subrequest body with tolerations."""
    return {**body, "tolerations": list(tolerations)}


def taint_rule(
    name: str,
    taint_body: dict[str, Any],
    *,
    selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A DeviceTaintRule; ``selector=None`` leaves ``deviceSelector`` out (matches nothing)."""
    spec: dict[str, Any] = {"taint": taint_body}
    if selector is not None:
        spec["deviceSelector"] = selector
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": spec,
    }


def counter_slice(
    name: str,
    sets: dict[str, dict[str, str]],
    *,
    node: str | None = None,
    pool: str | None = None,
    count: int = 2,
    all_nodes: bool = False,
) -> dict[str, Any]:
    """A slice holding only ``sharedCounters`` (its pool's counter sets)."""
    body = resource_slice(
        name, [], node=node, pool=pool, count=count, all_nodes=all_nodes, driver=GPU_DRIVER
    )
    del body["spec"]["devices"]
    body["spec"]["sharedCounters"] = [
        {"name": n, "counters": {c: {"value": v} for c, v in counters.items()}}
        for n, counters in sets.items()
    ]
    return body


def consuming(body: dict[str, Any], counter_set: str, **counters: str) -> dict[str, Any]:
    """``body`` (a device) consuming ``counters`` from ``counter_set`` too."""
    uses = [*body.get("consumesCounters", [])]
    uses.append(
        {"counterSet": counter_set, "counters": {c: {"value": v} for c, v in counters.items()}}
    )
    return {**body, "consumesCounters": uses}

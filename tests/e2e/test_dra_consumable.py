"""Consumable capacity against kube-scheduler (1.36+: DRAConsumableCapacity beta, on).

Two devices per node that allow multiple allocations, published twice as in
:mod:`tests.e2e.test_dra_partitionable` (the same slices on kube-scheduler's node and on
Lattice's): each has 40Gi of ``memory`` (request policy: default 8Gi, a range of 4Gi to
32Gi in steps of 4Gi) and 100 ``cores`` (default 25, valid values 25, 50, 100). The same
claims go to both schedulers, one pod at a time (first fit depends on the order): some
bind, some must stay pending because a capacity would be over-spent or a request is out
of the policy's range. Both must give the same verdicts and write the same allocations
(shareIDs aside: random UUIDs on both), and a checker of its own, reading the claims and
slices from the API, finds no capacity over-spent on either node.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any, Final

import pytest
import yaml
from kubernetes_asyncio import client

from lattice_dev.devcluster.build import kubernetes_version
from tests.e2e.differential.dra_cases import (
    KUBE_NODE,
    LATTICE_NODE,
    as_kube,
    claim_status,
    dra_plane,
    list_claims,
    pinned_verdicts,
    unstamped,
)
from tests.e2e.test_dra_partitionable import amount
from tests.e2e.test_scheduler import Plane

pytestmark = pytest.mark.skipif(
    kubernetes_version() < "v1.36", reason="DRAConsumableCapacity is off before 1.36"
)

DRIVER: Final = "vgpu.e2e.lattice.dev"
CLASS: Final = "vgpu"
CAPACITY: Final = {"memory": "40Gi", "cores": "100"}
POLICIES: Final = {
    "memory": {"default": "8Gi", "validRange": {"min": "4Gi", "max": "32Gi", "step": "4Gi"}},
    "cores": {"default": "25", "validValues": ["25", "50", "100"]},
}
Ask = dict[str, str]
ORDER: Final[list[tuple[str, list[Ask], bool]]] = [
    ("a", [{"memory": "6Gi"}], False),
    ("b", [{}], False),
    ("c", [{"memory": "36Gi"}], False),
    ("d", [{"memory": "4Gi"}, {"memory": "4Gi"}], True),
    ("e", [{"memory": "24Gi"}], False),
    ("f", [{"memory": "16Gi", "cores": "30"}], False),
    ("g", [{"memory": "12Gi", "cores": "50"}], False),
    ("h", [{}], False),
    ("i", [{}], False),
]
"""(case, per request its capacity requests, distinctAttribute over the requests), in
creation order. By hand (g0, g1: memory/cores used): a rounds 6Gi up to 8Gi, cores
default 25: g0 8/25; b takes both defaults: g0 16/50; c asks above the range: pending;
d's two requests must be on devices with distinct uuids: g0 20/75, g1 4/25; e: g0 would
hold 44Gi, g1 28/50; f (30 cores round up to 50): g0 would have 125 cores, g1 44Gi:
pending; g fills g1 exactly: 40/100; h fills g0's cores: 28/100; i: nowhere."""
EXPECTED: Final = [
    "bound",
    "bound",
    "pending",
    "bound",
    "bound",
    "pending",
    "bound",
    "bound",
    "pending",
]


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with dra_plane(tmp_path_factory.mktemp("dra-consumable")) as p:
        yield p


def slice_for(node: str) -> dict[str, Any]:
    devices = [
        {
            "name": f"g{i}",
            "allowMultipleAllocations": True,
            "attributes": {"uuid": {"string": f"{node}-g{i}"}},
            "capacity": {
                name: {"value": value, "requestPolicy": POLICIES[name]}
                for name, value in CAPACITY.items()
            },
        }
        for i in range(2)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"vgpu-{node}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def claim_for(ns: str, case: str, node: str, asks: list[Ask], distinct: bool) -> dict[str, Any]:
    requests = []
    for i, ask in enumerate(asks):
        exactly: dict[str, Any] = {"deviceClassName": CLASS}
        if ask:
            exactly["capacity"] = {"requests": ask}
        requests.append({"name": f"r{i}", "exactly": exactly})
    devices: dict[str, Any] = {"requests": requests}
    if distinct:
        devices["constraints"] = [{"distinctAttribute": f"{DRIVER}/uuid"}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"{case}-{node}", "namespace": ns},
        "spec": {"devices": devices},
    }


def comparable(allocation: dict[str, Any]) -> dict[str, Any]:
    """The allocation with each result's ``shareID`` checked to be a UUID and dropped, and
    its ``consumedCapacity`` read as exact integers (the two write them in other forms)."""
    out = dict(allocation)
    results = []
    for r in allocation["devices"]["results"]:
        share = r.get("shareID")
        assert isinstance(share, str), r
        assert str(uuid.UUID(share)) == share, r
        entry = {k: v for k, v in r.items() if k != "shareID"}
        entry["consumedCapacity"] = {
            k: amount(v) for k, v in (r.get("consumedCapacity") or {}).items()
        }
        results.append(entry)
    out["devices"] = {**allocation["devices"], "results": results}
    return out


async def overspent(api: client.ApiClient, ns: str) -> dict[str, dict[str, tuple[int, int]]]:
    """Per device (``node/device/capacity``), (consumed by the claims' shares, capacity),
    from the API's claims and slices."""
    objects = client.CustomObjectsApi(api)
    listed = await objects.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")
    capacity: dict[tuple[str, str, str], int] = {}
    for s in listed["items"]:
        if s["spec"]["driver"] != DRIVER:
            continue
        for d in s["spec"]["devices"]:
            for name, c in d["capacity"].items():
                capacity[(s["spec"]["pool"]["name"], d["name"], name)] = amount(c["value"])
    used = dict.fromkeys(capacity, 0)
    for body in (await list_claims(api, ns)).values():
        allocation = (body.get("status") or {}).get("allocation") or {}
        for r in (allocation.get("devices") or {}).get("results") or []:
            for name, value in (r.get("consumedCapacity") or {}).items():
                used[(r["pool"], r["device"], name)] += amount(value)
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for (pool, device, name), value in capacity.items():
        out.setdefault(pool, {})[f"{device}/{name}"] = (used[(pool, device, name)], value)
    return out


async def test_shares_of_devices_as_kube_scheduler_allocates_them(
    plane: Plane, api: client.ApiClient, ns: str
) -> None:
    bodies: list[dict[str, Any]] = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": CLASS},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
    ]
    for node in (KUBE_NODE, LATTICE_NODE):
        bodies.append(slice_for(node))
        bodies += [claim_for(ns, case, node, asks, d) for case, asks, d in ORDER]
    plane.run("apply", "-f", "-", stdin=yaml.safe_dump_all(bodies))
    sched = plane.lattice().start()
    try:
        verdicts = await pinned_verdicts(api, ns, [case for case, _, _ in ORDER])
        assert verdicts[KUBE_NODE] == EXPECTED
        assert verdicts[LATTICE_NODE] == verdicts[KUBE_NODE]
        for (case, _, _), outcome in zip(ORDER, EXPECTED, strict=True):
            ours = await claim_status(api, ns, f"{case}-{LATTICE_NODE}")
            kubes = await claim_status(api, ns, f"{case}-{KUBE_NODE}")
            if outcome == "pending":
                assert "allocation" not in ours, case
                assert "allocation" not in kubes, case
                continue
            mine = comparable(as_kube(unstamped(ours["allocation"]) or {}))
            assert mine == comparable(unstamped(kubes["allocation"]) or {}), case
        capacities = await overspent(api, ns)
        assert set(capacities) == {KUBE_NODE, LATTICE_NODE}
        for pool, per_capacity in capacities.items():
            for name, (used, value) in per_capacity.items():
                assert used <= value, (pool, name, used, value)
        # By hand (ORDER's docstring): g1 is full, g0's cores are.
        assert capacities[LATTICE_NODE] == {
            "g0/memory": (amount("28Gi"), amount("40Gi")),
            "g0/cores": (100, 100),
            "g1/memory": (amount("40Gi"), amount("40Gi")),
            "g1/cores": (100, 100),
        }
    finally:
        sched.stop()
    assert sched.proc is not None
    assert sched.proc.returncode == 0


FRACTION_DRIVER: Final = "frac.e2e.lattice.dev"


def milli(text: str) -> int:
    """The checker's own reading of a whole or milli quantity, in milliunits."""
    match = re.fullmatch(r"(\d+)(m?)", text)
    assert match is not None, f"quantity {text!r} outside what this checker reads"
    return int(match[1]) * (1 if match[2] else 1000)


async def test_a_fractional_range_rounds_as_kube_scheduler_does(
    plane: Plane, api: client.ApiClient, ns: str
) -> None:
    """A ``validRange`` in milliunits (100m steps): DRAFractionalCapacityRange is beta in
    1.37 but on only with ``--min-compatibility-version`` 1.37 (kube's default is one
    release back), so a default kube-scheduler rounds 150m up to whole units (1), not to
    200m; Lattice must write what kube writes."""
    bodies: list[dict[str, Any]] = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "frac"},
            "spec": {
                "selectors": [{"cel": {"expression": f'device.driver == "{FRACTION_DRIVER}"'}}]
            },
        }
    ]
    for node in (KUBE_NODE, LATTICE_NODE):
        policy = {"default": "100m", "validRange": {"min": "100m", "step": "100m"}}
        bodies.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"frac-{node}"},
                "spec": {
                    "driver": FRACTION_DRIVER,
                    "nodeName": node,
                    "pool": {"name": f"frac-{node}", "generation": 1, "resourceSliceCount": 1},
                    "devices": [
                        {
                            "name": "f0",
                            "allowMultipleAllocations": True,
                            "capacity": {"share": {"value": "4", "requestPolicy": policy}},
                        }
                    ],
                },
            }
        )
        bodies.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"j-{node}", "namespace": ns},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "r0",
                                "exactly": {
                                    "deviceClassName": "frac",
                                    "capacity": {"requests": {"share": "150m"}},
                                },
                            }
                        ]
                    }
                },
            }
        )
    plane.run("apply", "-f", "-", stdin=yaml.safe_dump_all(bodies))
    sched = plane.lattice().start()
    try:
        verdicts = await pinned_verdicts(api, ns, ["j"])
        assert verdicts == {KUBE_NODE: ["bound"], LATTICE_NODE: ["bound"]}, verdicts
        kubes = await claim_status(api, ns, f"j-{KUBE_NODE}")
        ours = await claim_status(api, ns, f"j-{LATTICE_NODE}")

        def share(status: dict[str, Any]) -> int:
            (result,) = status["allocation"]["devices"]["results"]
            return milli(result["consumedCapacity"]["share"])

        assert share(kubes) == 1000, kubes["allocation"]
        assert share(ours) == share(kubes), ours["allocation"]
    finally:
        sched.stop()

"""Partitionable devices against kube-scheduler (1.36+: DRAPartitionableDevices beta, on).

One MIG-like GPU per node, published twice as in :mod:`tests.e2e.test_dra_vs_kube` (the
same slices on kube-scheduler's node and on Lattice's): a slice with the counter set
(memory 40Gi, 7 compute slices), and a slice with the full device ``gpu-0`` consuming all
of it, two ``3g`` partitions (20Gi, 3 slices) and seven ``1g`` ones (5Gi, 1 slice). The
same claims go to both, one pod at a time (first fit depends on the order): some bind,
some must stay pending because a counter would be over-spent. Both schedulers must give
the same verdicts and write the same allocations, and a checker of its own, reading the
claims and slices from the API, finds no counter over-spent on either node.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Final

import pytest
import yaml
from kubernetes_asyncio import client

from lattice_dev.devcluster.build import kubernetes_version
from lattice_dev.devcluster.kube import poll
from tests.e2e.differential.dra_cases import (
    BOUND,
    KUBE_NODE,
    LATTICE_NODE,
    as_kube,
    claim_status,
    dra_plane,
    list_claims,
    pinned,
    pinned_verdicts,
    unstamped,
    verdict,
)
from tests.e2e.test_scheduler import Plane, create_pods, list_pods

pytestmark = pytest.mark.skipif(
    kubernetes_version() < "v1.36", reason="DRAPartitionableDevices is off before 1.36"
)

DRIVER: Final = "mig.e2e.lattice.dev"
CLASS: Final = "mig"
SET: Final = "gpu-0-counters"
COUNTERS: Final = {"memory": "40Gi", "slices": "7"}
PROFILES: Final = {"full": ("40Gi", "7"), "3g": ("20Gi", "3"), "1g": ("5Gi", "1")}
ORDER: Final = [
    ("p1", "1g", 1),
    ("full", "full", 1),
    ("p3a", "3g", 1),
    ("p3b", "3g", 1),
    ("p1x3", "1g", 3),
    ("p1c", "1g", 1),
]
"""(case, profile, count) in creation order. By hand: 1g (5Gi/1) binds; the full device
needs 40Gi with 35Gi left: pending; a 3g binds (25Gi/4 used); the second 3g would need
45Gi: pending; three 1g make exactly 40Gi/7: bind; one more 1g: pending."""
EXPECTED: Final = ["bound", "pending", "bound", "pending", "bound", "pending"]


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with dra_plane(tmp_path_factory.mktemp("dra-partitionable")) as p:
        yield p


def _device(name: str, profile: str) -> dict[str, Any]:
    memory, slices = PROFILES[profile]
    return {
        "name": name,
        "attributes": {"profile": {"string": profile}},
        "consumesCounters": [
            {
                "counterSet": SET,
                "counters": {"memory": {"value": memory}, "slices": {"value": slices}},
            }
        ],
    }


def slices_for(node: str) -> list[dict[str, Any]]:
    pool = {"name": node, "generation": 1, "resourceSliceCount": 2}
    devices = [_device("gpu-0", "full")]
    devices += [_device(f"mig-3g-{i}", "3g") for i in range(2)]
    devices += [_device(f"mig-1g-{i}", "1g") for i in range(7)]
    counters = {k: {"value": v} for k, v in COUNTERS.items()}
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"mig-{node}-counters"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": pool,
                "sharedCounters": [{"name": SET, "counters": counters}],
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"mig-{node}-devices"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": pool, "devices": devices},
        },
    ]


def claim_for(ns: str, case: str, node: str, profile: str, count: int) -> dict[str, Any]:
    selector = f'device.attributes["{DRIVER}"].profile == "{profile}"'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"{case}-{node}", "namespace": ns},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": CLASS,
                            "count": count,
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ]
            }
        },
    }


_UNITS: Final = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def amount(text: str) -> int:
    """The checker's own reading of the integer quantities used here (no decimals)."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|)", text)
    assert match is not None, f"quantity {text!r} outside what this checker reads"
    return int(match[1]) * _UNITS[match[2]]


async def overspent(api: client.ApiClient, ns: str) -> dict[str, dict[str, tuple[int, int]]]:
    """Per pool, each counter's (consumed, value) from the API's claims and slices."""
    objects = client.CustomObjectsApi(api)
    listed = await objects.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")
    ours = [s for s in listed["items"] if s["spec"]["driver"] == DRIVER]
    values: dict[tuple[str, str, str], int] = {}
    consumes: dict[tuple[str, str], list[tuple[str, str, int]]] = {}
    for s in ours:
        pool = s["spec"]["pool"]["name"]
        for counter_set in s["spec"].get("sharedCounters") or []:
            for name, c in counter_set["counters"].items():
                values[(pool, counter_set["name"], name)] = amount(c["value"])
        for d in s["spec"].get("devices") or []:
            consumes[(pool, d["name"])] = [
                (use["counterSet"], name, amount(c["value"]))
                for use in d.get("consumesCounters") or []
                for name, c in use["counters"].items()
            ]
    used = dict.fromkeys(values, 0)
    for body in (await list_claims(api, ns)).values():
        allocation = (body.get("status") or {}).get("allocation") or {}
        for r in (allocation.get("devices") or {}).get("results") or []:
            if r["driver"] != DRIVER:
                continue
            for counter_set, name, value in consumes[(r["pool"], r["device"])]:
                used[(r["pool"], counter_set, name)] += value
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for (pool, counter_set, name), value in values.items():
        out.setdefault(pool, {})[f"{counter_set}/{name}"] = (used[(pool, counter_set, name)], value)
    return out


async def test_partitions_share_counters_as_kube_scheduler_allocates_them(
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
        bodies += slices_for(node)
        bodies += [claim_for(ns, case, node, p, n) for case, p, n in ORDER]
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
            assert as_kube(unstamped(ours["allocation"]) or {}) == unstamped(kubes["allocation"]), (
                case
            )
        counters = await overspent(api, ns)
        assert set(counters) == {KUBE_NODE, LATTICE_NODE}
        for pool, per_counter in counters.items():
            for counter, (used, value) in per_counter.items():
                assert used <= value, (pool, counter, used, value)
        # The pending pods were refused for the counters: all of both is spent.
        assert counters[LATTICE_NODE] == {
            f"{SET}/memory": (amount("40Gi"), amount("40Gi")),
            f"{SET}/slices": (7, 7),
        }
    finally:
        sched.stop()
    assert sched.proc is not None
    assert sched.proc.returncode == 0


PD_DRIVER: Final = "pd.e2e.lattice.dev"


def per_device_slices(node: str) -> list[dict[str, Any]]:
    """Pool ``pd-<node>``: a counter set of 12 links, and a per-device slice whose devices
    name the node themselves, by ``nodeName`` (d-0, d-2) or by ``nodeSelector`` (d-1)."""
    pool = {"name": f"pd-{node}", "generation": 1, "resourceSliceCount": 2}
    hostname = {
        "nodeSelectorTerms": [
            {
                "matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                ]
            }
        ]
    }

    def dev(name: str, links: str, where: dict[str, Any]) -> dict[str, Any]:
        uses = [{"counterSet": "fabric", "counters": {"links": {"value": links}}}]
        return {"name": name, "consumesCounters": uses, **where}

    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"pd-{node}-counters"},
            "spec": {
                "driver": PD_DRIVER,
                "nodeName": node,
                "pool": pool,
                "sharedCounters": [{"name": "fabric", "counters": {"links": {"value": "12"}}}],
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"pd-{node}-devices"},
            "spec": {
                "driver": PD_DRIVER,
                "perDeviceNodeSelection": True,
                "pool": pool,
                "devices": [
                    dev("d-0", "6", {"nodeName": node}),
                    dev("d-1", "6", {"nodeSelector": hostname}),
                    dev("d-2", "1", {"nodeName": node}),
                ],
            },
        },
    ]


async def test_devices_with_their_own_node_selection_as_kube_scheduler_allocates_them(
    plane: Plane, api: client.ApiClient, ns: str
) -> None:
    """By hand: d-0 (6 of 12 links, its nodeName); d-1 (12 of 12, its nodeSelector becomes
    the allocation's); d-2 would make 13: pending."""
    bodies: list[dict[str, Any]] = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "pd"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{PD_DRIVER}"'}}]},
        }
    ]
    cases = ["a", "b", "c"]
    for node in (KUBE_NODE, LATTICE_NODE):
        bodies += per_device_slices(node)
        for case in cases:
            body = claim_for(ns, case, node, "", 1)
            del body["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
            body["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "pd"
            bodies.append(body)
    plane.run("apply", "-f", "-", stdin=yaml.safe_dump_all(bodies))
    sched = plane.lattice().start()
    try:
        for case in cases:
            await create_pods(api, ns, [pinned(case, n) for n in (KUBE_NODE, LATTICE_NODE)])

            async def settled(case: str = case) -> dict[str, str | None] | None:
                pods = {p["metadata"]["name"]: p for p in await list_pods(api, ns)}
                names = [f"{case}-{n}" for n in (KUBE_NODE, LATTICE_NODE)]
                seen = {n: verdict(pods[n]) for n in names if n in pods}
                return seen if len(seen) == 2 and all(seen.values()) else None

            seen = await poll(settled, within=60, interval=0.5)
            expected = "Unschedulable" if case == "c" else BOUND
            assert seen == {f"{case}-{n}": expected for n in (KUBE_NODE, LATTICE_NODE)}, case
        allocations = {}
        for case in ("a", "b"):
            ours = await claim_status(api, ns, f"{case}-{LATTICE_NODE}")
            kubes = await claim_status(api, ns, f"{case}-{KUBE_NODE}")
            assert as_kube(unstamped(ours["allocation"]) or {}) == unstamped(kubes["allocation"]), (
                case
            )
            allocations[case] = kubes["allocation"]
        assert [r["device"] for r in allocations["a"]["devices"]["results"]] == ["d-0"]
        assert [r["device"] for r in allocations["b"]["devices"]["results"]] == ["d-1"]
        assert allocations["b"]["nodeSelector"]["nodeSelectorTerms"][0]["matchExpressions"][0][
            "values"
        ] == [KUBE_NODE]
    finally:
        sched.stop()
    assert sched.proc is not None
    assert sched.proc.returncode == 0

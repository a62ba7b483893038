"""DRA allocations agree with kube-scheduler v1.34.4's, byte for byte, where its choice is
deterministic (one pool with one slice on the node).

One plane runs kube-scheduler and Lattice side by side with disjoint devices (the design of
the research brief): every case has a driver of its own and publishes the same devices
twice, one slice on each node; kube-scheduler's pod is pinned to the first node and
Lattice's to the second, so neither ever sees the other's devices. Each case's DeviceClass
and claim (with class and claim configs) are the same for both (cases: a count-3
matchAttribute that backtracks, firstAvailable fallback, All with cel.bind, semver and
quantity selectors, two requests with a scoped constraint, adminAccess, a pool whose older
generation's slice must be ignored); the written
``status.allocation`` must be equal once node and pool names are mapped, and a claim that
errors must fail both schedulers' attempts with SchedulerError.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any, Final, cast

import pytest
import yaml
from kubernetes_asyncio import client

from lattice_dev.devcluster.build import kubernetes_version
from lattice_dev.devcluster.kube import poll
from tests.e2e.differential.dra_cases import (
    KUBE_NODE,
    LATTICE_NODE,
    STAMP,
    as_kube,
    claim_status,
    dra_plane,
    list_claims,
    pinned,
    unstamped,
)
from tests.e2e.test_dra import ClaimRecorder, driver_sets, reserved_claim
from tests.e2e.test_gangs import events_of
from tests.e2e.test_scheduler import Plane, create_pods, list_pods, pod


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with dra_plane(tmp_path_factory.mktemp("dra-kube")) as p:
        yield p


def _device(i: int) -> dict[str, Any]:
    return {
        "name": f"dev-{i}",
        "attributes": {
            "numa": {"int": i % 2},
            "model": {"string": "A100" if i < 3 else "H100"},
            "fw": {"version": f"1.{i}.0"},
        },
        "capacity": {"memory": {"value": "40Gi" if i % 3 else "80Gi"}},
    }


def _exactly(case: str, *selectors: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": case, **extra}
    if selectors:
        body["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return body


CASES: Final[dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]]] = {
    # name -> (requests, constraints); the class selects the case's driver.
    "count-match": (
        [{"name": "gpu", "exactly": _exactly("count-match", count=3)}],
        [{"matchAttribute": "count-match.e2e.lattice.dev/numa"}],
    ),
    "first-available": (
        [
            {
                "name": "gpu",
                "firstAvailable": [
                    {
                        "name": "big",
                        **_exactly(
                            "first-available",
                            'device.attributes["first-available.e2e.lattice.dev"].model == "B200"',
                        ),
                    },
                    {"name": "small", **_exactly("first-available", count=2)},
                ],
            }
        ],
        [],
    ),
    "all-cel": (
        [
            {
                "name": "gpu",
                "exactly": _exactly(
                    "all-cel",
                    'cel.bind(d, device.attributes["all-cel.e2e.lattice.dev"], '
                    'd.fw.isGreaterThan(semver("1.0.0")))',
                    'device.capacity["all-cel.e2e.lattice.dev"].memory == quantity("40960Mi")',
                    allocationMode="All",
                ),
            }
        ],
        [],
    ),
    "two-requests": (
        [
            {"name": "a", "exactly": _exactly("two-requests")},
            {"name": "b", "exactly": _exactly("two-requests", count=2)},
        ],
        [{"requests": ["b"], "matchAttribute": "two-requests.e2e.lattice.dev/model"}],
    ),
    "admin": (
        [{"name": "gpu", "exactly": _exactly("admin", count=2, adminAccess=True)}],
        [],
    ),
    "generation": ([{"name": "gpu", "exactly": _exactly("generation", count=2)}], []),
}
ERROR_CASE: Final = "cel-error"
OLD_GENERATION: Final = "generation"
"""The case whose pools also have an older generation's slice (ignored by both)."""


def objects(
    ns: str, case: str, requests: list[dict[str, Any]], constraints: list[Any]
) -> list[dict[str, Any]]:
    driver = f"{case}.e2e.lattice.dev"
    opaque = {"opaque": {"driver": driver, "parameters": {"case": case}}}
    out: list[dict[str, Any]] = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": case},
            "spec": {
                "selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}],
                "config": [opaque],
            },
        }
    ]
    for node in (KUBE_NODE, LATTICE_NODE):
        out.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{case}-{node}"},
                "spec": {
                    "driver": driver,
                    "nodeName": node,
                    "pool": {"name": f"{case}-{node}", "generation": 1, "resourceSliceCount": 1},
                    "devices": [_device(i) for i in range(5)],
                },
            }
        )
        if case == OLD_GENERATION:
            out[-1]["spec"]["pool"]["generation"] = 2
            older = json.loads(json.dumps(out[-1]))
            older["metadata"]["name"] = f"{case}-{node}-old"
            older["spec"]["pool"]["generation"] = 1
            older["spec"]["devices"] = [{"name": "old-0"}, {"name": "old-1"}]
            out.append(older)
        devices: dict[str, Any] = {"requests": requests, "config": [{"requests": [], **opaque}]}
        if constraints:
            devices["constraints"] = constraints
        out.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"{case}-{node}", "namespace": ns},
                "spec": {"devices": devices},
            }
        )
    return out


async def test_allocations_agree_with_kube_scheduler(
    plane: Plane, api: client.ApiClient, ns: str
) -> None:
    error_requests = [
        {
            "name": "gpu",
            "exactly": _exactly(
                ERROR_CASE, f'device.attributes["{ERROR_CASE}.e2e.lattice.dev"].missing == 1'
            ),
        }
    ]
    bodies = [o for case, (r, c) in CASES.items() for o in objects(ns, case, r, c)]
    bodies += objects(ns, ERROR_CASE, error_requests, [])
    # adminAccess needs the namespace label (API admission checks it).
    plane.run("label", "namespace", ns, "resource.kubernetes.io/admin-access=true")
    plane.run("apply", "-f", "-", stdin=yaml.safe_dump_all(bodies))
    sched = plane.lattice().start()
    try:
        cases = [*CASES, ERROR_CASE]
        await create_pods(api, ns, [pinned(c, n) for c in cases for n in (KUBE_NODE, LATTICE_NODE)])

        async def settled() -> dict[str, dict[str, Any]] | None:
            pods = {p["metadata"]["name"]: p for p in await list_pods(api, ns)}
            done = {
                name
                for name, p in pods.items()
                if p["spec"].get("nodeName")
                or any(
                    c["type"] == "PodScheduled" and c.get("reason") == "SchedulerError"
                    for c in p.get("status", {}).get("conditions") or []
                )
            }
            return pods if len(done) == 2 * len(cases) else None

        pods = await poll(settled, within=120, interval=0.5)
        for case in CASES:
            kube_pod, ours = pods[f"{case}-{KUBE_NODE}"], pods[f"{case}-{LATTICE_NODE}"]
            assert kube_pod["spec"]["nodeName"] == KUBE_NODE, case
            assert ours["spec"].get("nodeName") == LATTICE_NODE, [
                ln.get("reason")
                for ln in sched.lines()
                if ln.get("event") == "claim_binding_failed"
            ][:1]
            kube_status = await claim_status(api, ns, f"{case}-{KUBE_NODE}")
            our_status = await claim_status(api, ns, f"{case}-{LATTICE_NODE}")
            ours_, kubes = our_status["allocation"], kube_status["allocation"]
            assert as_kube(unstamped(ours_) or {}) == unstamped(kubes), case
            # 1.36+: both stamp the claim they reserve (binding timeouts count from it).
            stamped = kubernetes_version() >= "v1.36"
            assert (STAMP in ours_, STAMP in kubes) == (stamped, stamped), case
        for node in (KUBE_NODE, LATTICE_NODE):
            failed = pods[f"{ERROR_CASE}-{node}"]
            assert not failed["spec"].get("nodeName")
            assert "allocation" not in await claim_status(api, ns, f"{ERROR_CASE}-{node}")
    finally:
        sched.stop()
    assert sched.proc is not None
    assert sched.proc.returncode == 0


async def test_two_schedulers_with_their_own_dra_nodes_allocate_concurrently(
    plane: Plane, api: client.ApiClient, ns: str
) -> None:
    """The two-scheduler rule, live. One driver publishes 6 devices on each node; Lattice
    gets LATTICE_NODE by ``spec.dra.nodeSelector``, kube-scheduler's pods get KUBE_NODE by
    their own nodeSelector (kube has no such setting). 5 kube pods and 7 Lattice pods with
    template claims, created at once: the 5 and 6 of the 7 bind, Lattice's on its node, no
    device in two claims; the 7th stays pending with a reason naming the setting, though
    KUBE_NODE still has a free device. A claim then written by hand with a device Lattice
    allocated gets a DeviceDoubleAllocated Event."""
    driver = f"{ns}.pools.lattice.dev"
    klass = f"{ns}-pools"
    one_device = {"name": "d", "exactly": {"deviceClassName": klass}}
    bodies: list[dict[str, Any]] = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": klass},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one", "namespace": ns},
            "spec": {"spec": {"devices": {"requests": [one_device]}}},
        },
    ]
    for node in (KUBE_NODE, LATTICE_NODE):
        bodies.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{ns}-pools-{node}"},
                "spec": {
                    "driver": driver,
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": f"dev-{i}"} for i in range(6)],
                },
            }
        )
    bodies.append(
        {
            "apiVersion": "lattice.dev/v1alpha1",
            "kind": "LatticeScheduler",
            "metadata": {"name": "lattice"},
            "spec": {
                "schedulerName": "lattice",
                "dra": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": LATTICE_NODE}}},
            },
        }
    )
    plane.run("apply", "-f", "-", stdin=yaml.safe_dump_all(bodies))
    claims = [{"name": "d", "resourceClaimTemplateName": "one"}]
    kube_pods = [
        pod(
            f"kube-{i}",
            scheduler="default-scheduler",
            nodeSelector={"kubernetes.io/hostname": KUBE_NODE},
            resourceClaims=claims,
        )
        for i in range(5)
    ]
    ours = [pod(f"ours-{i}", resourceClaims=claims) for i in range(7)]
    sched = plane.lattice().start()
    objects = client.CustomObjectsApi(api)
    try:
        await create_pods(api, ns, kube_pods + ours)

        async def settled() -> dict[str, dict[str, Any]] | None:
            pods = {p["metadata"]["name"]: p for p in await list_pods(api, ns)}
            bound = [p for p in pods.values() if p["spec"].get("nodeName")]
            return pods if len(bound) == 11 else None

        pods = await poll(settled, within=120, interval=0.5)
        for name, p in pods.items():
            if name.startswith("kube-"):
                assert p["spec"]["nodeName"] == KUBE_NODE, name
        ours_bound = [
            p for n, p in pods.items() if n.startswith("ours-") and p["spec"].get("nodeName")
        ]
        assert len(ours_bound) == 6
        assert {p["spec"]["nodeName"] for p in ours_bound} == {LATTICE_NODE}
        (waiting,) = [n for n, p in pods.items() if not p["spec"].get("nodeName")]

        taken: list[tuple[str, str, str]] = []
        for body in (await list_claims(api, ns)).values():
            allocation = (body.get("status") or {}).get("allocation")
            if allocation:
                taken += [
                    (r["driver"], r["pool"], r["device"]) for r in allocation["devices"]["results"]
                ]
        assert len(taken) == 11
        assert len(set(taken)) == 11, "a device in two claims"

        async def outside() -> list[Any] | None:
            evs = [
                e
                for e in await events_of(api, ns, "FailedScheduling")
                if e.involved_object.name == waiting
                and "node(s) outside Lattice's DRA nodes (LatticeScheduler spec.dra.nodeSelector)"
                in e.message
            ]
            return evs or None

        await poll(outside, within=60, interval=0.5)

        lattice_device = next(t for t in taken if t[1] == LATTICE_NODE)
        dup = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "dup", "namespace": ns},
            "spec": {
                "devices": {"requests": [{"name": "d", "exactly": {"deviceClassName": klass}}]}
            },
        }
        plane.run("apply", "-f", "-", stdin=yaml.safe_dump(dup))
        body = await objects.get_namespaced_custom_object(
            "resource.k8s.io", "v1", ns, "resourceclaims", "dup"
        )
        driver_, pool_, device_ = lattice_device
        body["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "d", "driver": driver_, "pool": pool_, "device": device_}
                    ]
                }
            }
        }
        await objects.replace_namespaced_custom_object_status(
            "resource.k8s.io", "v1", ns, "resourceclaims", "dup", body
        )

        async def double() -> list[Any] | None:
            evs = [
                e
                for e in await events_of(api, ns, "DeviceDoubleAllocated")
                if e.involved_object.kind == "ResourceClaim"
            ]
            return evs or None

        (event,) = await poll(double, within=60, interval=0.5)
        assert "/".join(lattice_device) in event.message
    finally:
        sched.stop()
        plane.run("delete", "resourceclaim", "dup", "-n", ns, "--ignore-not-found")
        await cast(Any, objects).patch_cluster_custom_object(
            "lattice.dev",
            "v1alpha1",
            "latticeschedulers",
            "lattice",
            {"spec": {"dra": None}},
            _content_type="application/merge-patch+json",
        )
        plane.run(
            "delete", "resourceslices", *(f"{ns}-pools-{n}" for n in (KUBE_NODE, LATTICE_NODE))
        )
        plane.run("delete", "deviceclass", klass)
    assert sched.proc is not None
    assert sched.proc.returncode == 0


BC_DRIVER: Final = "bc.e2e.lattice.dev"
BC_ATTACHED: Final = f"{BC_DRIVER}/attached"
BC_FAILED: Final = f"{BC_DRIVER}/attach-failed"


def binding_objects(ns: str) -> list[dict[str, Any]]:
    """Per node two pools: ``a-<node>`` of two devices with binding conditions (and
    ``bindsToNode``), ``b-<node>`` of one plain device; claims ``plain``, ``waits`` and
    ``fails`` per node, one device each."""
    waiting = {
        "bindsToNode": True,
        "bindingConditions": [BC_ATTACHED],
        "bindingFailureConditions": [BC_FAILED],
    }
    bodies: list[dict[str, Any]] = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": f"{ns}-bc"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{BC_DRIVER}"'}}]},
        }
    ]
    request = {"name": "dev", "exactly": {"deviceClassName": f"{ns}-bc"}}
    for node in (KUBE_NODE, LATTICE_NODE):
        for pool, devices in (
            ("a", [{"name": f"dev-{i}", **waiting} for i in range(2)]),
            ("b", [{"name": "dev-0"}]),
        ):
            bodies.append(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": f"{ns}-bc-{pool}-{node}"},
                    "spec": {
                        "driver": BC_DRIVER,
                        "nodeName": node,
                        "pool": {
                            "name": f"{pool}-{node}",
                            "generation": 1,
                            "resourceSliceCount": 1,
                        },
                        "devices": devices,
                    },
                }
            )
        bodies += [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"{case}-{node}", "namespace": ns},
                "spec": {"devices": {"requests": [request]}},
            }
            for case in ("plain", "waits", "fails")
        ]
    return bodies


async def test_binding_conditions_agree_with_kube_scheduler(
    plane: Plane, api: client.ApiClient, ns: str
) -> None:
    """DRADeviceBindingConditions (1.36+) on both schedulers, each on its own node: the
    plain pool is preferred to the one with binding conditions that sorts first; a claim
    on a device with conditions gets the same allocation (conditions copied, the node
    pinned), the same BindingConditionsPending event, and its pod binds only once the
    condition is True; a failure condition gives the same FailedScheduling and both give
    the allocation back."""
    if kubernetes_version() < "v1.36":
        pytest.skip("DRADeviceBindingConditions is off before 1.36")
    plane.run("apply", "-f", "-", stdin=yaml.safe_dump_all(binding_objects(ns)))
    recorder = ClaimRecorder(api, ns)
    recorder.start()
    core = client.CoreV1Api(api)
    nodes = (KUBE_NODE, LATTICE_NODE)
    sched = plane.lattice().start()

    async def allocations(case: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """(kube's, Lattice's as kube's) allocation of the case, once both are reserved."""
        for node in nodes:
            name = f"{case}-{node}"
            await poll(lambda: reserved_claim(api, ns, name), within=60)  # noqa: B023
        kube = (await claim_status(api, ns, f"{case}-{KUBE_NODE}"))["allocation"]
        ours = (await claim_status(api, ns, f"{case}-{LATTICE_NODE}"))["allocation"]
        return unstamped(kube) or {}, as_kube(unstamped(ours) or {})

    async def bound(case: str) -> list[bool]:
        """Per node, whether the case's pod is bound."""
        return [
            bool((await core.read_namespaced_pod(f"{case}-{n}", ns)).spec.node_name) for n in nodes
        ]

    try:
        await create_pods(api, ns, [pinned("plain", n) for n in nodes])
        kube, ours = await allocations("plain")
        assert ours == kube
        assert [r["pool"] for r in kube["devices"]["results"]] == [f"b-{KUBE_NODE}"]

        await create_pods(api, ns, [pinned("waits", n) for n in nodes])
        kube, ours = await allocations("waits")
        assert ours == kube
        (result,) = kube["devices"]["results"]
        assert (result["pool"], result["bindingConditions"]) == (f"a-{KUBE_NODE}", [BC_ATTACHED])
        await asyncio.sleep(2)
        assert await bound("waits") == [False, False]
        pending = {
            e.involved_object.name: e.message
            for e in await events_of(api, ns, "BindingConditionsPending")
        }
        theirs = pending[f"waits-{LATTICE_NODE}"].replace(LATTICE_NODE, KUBE_NODE)
        assert theirs == pending[f"waits-{KUBE_NODE}"]
        for node in nodes:
            await driver_sets(api, ns, f"waits-{node}", (BC_ATTACHED, "True", "Attached"))

        async def both_bound() -> bool | None:
            return all(await bound("waits")) or None  # kube checks every 5 s

        await poll(both_bound, within=30, interval=0.5)
        for node in nodes:
            assert (await core.read_namespaced_pod(f"waits-{node}", ns)).spec.node_name == node

        await create_pods(api, ns, [pinned("fails", n) for n in nodes])
        kube, ours = await allocations("fails")
        assert ours == kube
        for node in nodes:
            failure = (BC_FAILED, "True", "NoPath")
            await driver_sets(api, ns, f"fails-{node}", (BC_ATTACHED, "False", "Wait"), failure)

        async def failed() -> dict[str, str] | None:
            said = {
                e.involved_object.name: e.message
                for e in await events_of(api, ns, "FailedScheduling")
                if "device binding failed" in e.message
            }
            return said if len(said) == 2 else None

        said = await poll(failed, within=30, interval=0.5)
        theirs = said[f"fails-{LATTICE_NODE}"].replace(LATTICE_NODE, KUBE_NODE)
        assert theirs == said[f"fails-{KUBE_NODE}"]

        async def given_back() -> bool | None:
            return all(recorder.given_back(f"fails-{n}") for n in nodes) or None

        await poll(given_back, within=30, interval=0.3)
        assert await bound("fails") == [False, False]
    finally:
        sched.stop()
        await recorder.stop()
        for p in await list_pods(api, ns):
            await core.delete_namespaced_pod(p["metadata"]["name"], ns, grace_period_seconds=0)
        plane.run(
            "delete",
            "resourceslices",
            *(f"{ns}-bc-{pool}-{n}" for pool in "ab" for n in nodes),
            check=False,
        )
        plane.run("delete", "deviceclass", f"{ns}-bc", check=False)
    assert sched.proc is not None
    assert sched.proc.returncode == 0

"""Kubernetes' own PodGroup (``scheduling.k8s.io/v1beta1``) as a gang source, end to end, on
a 1.37 plane configured as an operator must for it: ``GenericWorkload=true`` and
``TopologyAwareWorkloadScheduling=true`` on every component and the ``v1beta1`` API
switched on. Pods name their group in
``spec.schedulingGroup.podGroupName``; Lattice runs under the shipped RBAC.

Checked from the API server: a gang of 4 that fits binds all of its members, inside one
rack when the group's ``schedulingConstraints.topology`` asks for one, and its
``PodGroupInitiallyScheduled`` condition turns True with reason ``Scheduled``; a gang that
fits in no rack binds nothing, and both its condition (False, ``Unschedulable``) and its
members' FailedScheduling say why.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from lattice_dev.devcluster.build import kubernetes_version
from lattice_dev.devcluster.cluster import ClusterConfig
from lattice_dev.devcluster.kube import poll
from scheduler.model.workload import UPSTREAM_GROUP, UPSTREAM_PLURAL, UPSTREAM_VERSION
from tests.e2e.lattice_proc import LatticeProcess
from tests.e2e.test_gang_topology import RACK, domains_of, rack_nodes
from tests.e2e.test_gang_topology import member as topology_member
from tests.e2e.test_gangs import events_of, wait_names_bound
from tests.e2e.test_scheduler import Plane, create_pods, lattice_plane

RACKS = {"r1": 2, "r2": 1}
"""Nodes per rack; 8 GPUs a node and members of 4 GPUs: r1 holds 4 members, r2 holds 2."""

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        kubernetes_version() < "v1.37",
        reason="scheduling.k8s.io/v1beta1 PodGroups are served from 1.37 (1.35 and 1.36 have "
        "no such API version, and 1.35 no TopologyAwareWorkloadScheduling gate)",
    ),
]


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    config = ClusterConfig(
        nodes=0,
        node_profile="gpu-8x",
        # The topology constraint is dropped by the API server without its own (alpha) gate.
        feature_gates=("GenericWorkload=true", "TopologyAwareWorkloadScheduling=true"),
        runtime_config=("scheduling.k8s.io/v1beta1=true",),
    )
    with lattice_plane(tmp_path_factory.mktemp("workloadplane"), config) as p:
        yield p


@pytest.fixture(scope="module")
def sched(plane: Plane) -> Iterator[LatticeProcess]:
    proc = plane.lattice(identity="upstream").start()
    yield proc
    proc.stop()


def member(name: str, group: str) -> dict[str, Any]:
    """A 4-GPU member naming its group the upstream way, not by scheduler-plugins' label."""
    body = topology_member(name, group, pool="upstream")
    del body["metadata"]["labels"]
    body["spec"]["schedulingGroup"] = {"podGroupName": group}
    return body


async def group(api: client.ApiClient, ns: str, name: str, size: int, key: str | None) -> None:
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": size}}}
    if key is not None:
        spec["schedulingConstraints"] = {"topology": [{"key": key}]}
    body = {
        "apiVersion": f"{UPSTREAM_GROUP}/{UPSTREAM_VERSION}",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": spec,
    }
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        UPSTREAM_GROUP, UPSTREAM_VERSION, ns, UPSTREAM_PLURAL, body
    )
    await create_pods(api, ns, [member(f"{name}-{i}", name) for i in range(size)])


async def condition(api: client.ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    obj: dict[str, Any] = await client.CustomObjectsApi(api).get_namespaced_custom_object(
        UPSTREAM_GROUP, UPSTREAM_VERSION, ns, UPSTREAM_PLURAL, name
    )
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodGroupInitiallyScheduled":
            return dict(c)
    return None


async def racks_of(api: client.ApiClient, ns: str, prefix: str) -> list[str]:
    return [rack for _, rack in await domains_of(api, ns, prefix)]


async def test_upstream_podgroups_are_gangs_with_their_required_rack(
    api: client.ApiClient, ns: str, sched: LatticeProcess
) -> None:
    await rack_nodes(api, {"b1": RACKS}, "upstream", prefix="kwok-up")
    core = client.CoreV1Api(api)

    # 5 members of one rack: no rack holds more than 4. Nothing binds; both say why.
    await group(api, ns, "wide", 5, RACK)

    async def refused() -> dict[str, Any] | None:
        got = await condition(api, ns, "wide")
        return got if got is not None and got.get("status") == "False" else None

    got = await poll(refused, within=60, interval=0.5)
    assert got["reason"] == "Unschedulable", got
    assert f"no domain of {RACK} holds 5 members together" in got["message"], got

    async def explained() -> str | None:
        for e in await events_of(api, ns, "FailedScheduling"):
            if "wide" in e.message and "no domain of" in e.message:
                return str(e.message)
        return None

    assert "needs 20 GPUs in one" in await poll(explained, within=60, interval=0.5)
    assert await racks_of(api, ns, "wide-") == []
    for i in range(5):
        await core.delete_namespaced_pod(f"wide-{i}", ns, grace_period_seconds=0)

    # 4 members of one rack: only r1 holds them.
    await group(api, ns, "fits", 4, RACK)
    await wait_names_bound(api, ns, {f"fits-{i}" for i in range(4)}, within=60)
    assert await racks_of(api, ns, "fits-") == ["r1"] * 4

    async def scheduled() -> dict[str, Any] | None:
        got = await condition(api, ns, "fits")
        return got if got is not None and got.get("status") == "True" else None

    done = await poll(scheduled, within=60, interval=0.5)
    assert done["reason"] == "Scheduled", done

    # No topology constraint: 2 members go wherever they fit (r2 has room for both).
    await group(api, ns, "free", 2, None)
    await wait_names_bound(api, ns, {f"free-{i}" for i in range(2)}, within=60)
    assert len(await racks_of(api, ns, "free-")) == 2

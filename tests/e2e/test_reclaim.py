"""Reclaim end to end: scheduler-plugins' CapacityScheduling integration cases, replayed live.

`lattice run` (shipped RBAC) on two kwok nodes of 4 cpus, ElasticQuotas
(``scheduling.x-k8s.io/v1alpha1``) in fresh namespaces. As in upstream's
``test/integration/capacity_scheduling_test.go``, the existing pods are bound directly (no
scheduler placed them), the new pods are created together, and the outcome is read from
the objects: which pods end bound, which were evicted, which stay pending; and every
reclaimed pod carries a ``Preempted`` Event naming the quota and pod that reclaimed it.
Scaled from upstream's 100-cpu nodes: pods of 2 cpus (half a node) where upstream's take
half a node, of 1 cpu where upstream's take 1m against mins of a few millicores.

* cross-namespace: ns1 borrows (3 pods over a min of 2); ns2 at its min takes back ns1's
  cheapest pod, whatever its priority would say elsewhere; ns2's third pod, over its min,
  may take only lower-priority pods of ns2 and stays pending.
* in-namespace above min: each quota at its min; a new pod of each evicts the lower-priority
  pod of its own quota, never the other's.
* three quotas, refused at PreFilter while the nodes have room (the sum of mins is used):
  ns3 takes back ns1's borrowed mid-priority pods one by one, never its high one, and its
  last pod, over its min, stays pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any, cast

import pytest
from kubernetes_asyncio import client

from lattice_dev.devcluster.cluster import ClusterConfig
from lattice_dev.devcluster.kube import poll
from scheduler.core.quota import GROUP, KIND, PLURAL, VERSION
from tests.conftest import report_line
from tests.e2e.test_gangs import GROUP as GANG_GROUP
from tests.e2e.test_gangs import LABEL as GANG_LABEL
from tests.e2e.test_scheduler import Plane, lattice_plane

pytestmark = pytest.mark.cluster

CLASSES = {"rc-low": 10, "rc-mid": 20, "rc-high": 30}


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    config = ClusterConfig(nodes=2, node_profile="small")
    with lattice_plane(tmp_path_factory.mktemp("reclaimplane"), config) as p:
        yield p


def pod(name: str, cpu: str, klass: str, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "lattice",
        "priorityClassName": klass,
        "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}],
    }
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def quota(name: str, min_cpu: str, max_cpu: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {"min": {"cpu": min_cpu}, "max": {"cpu": max_cpu}},
    }


class Case:
    """One upstream case in namespaces of its own: quotas, existing pods, new pods."""

    def __init__(self, api: client.ApiClient, tag: str) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.prefix = f"rc-{os.getpid()}-{tag}"
        self.namespaces: list[str] = []

    def ns(self, short: str) -> str:
        return f"{self.prefix}-{short}"

    async def setup(self, quotas: dict[str, tuple[str, str]]) -> None:
        for short, (lo, hi) in quotas.items():
            name = self.ns(short)
            await self.core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": name}}))
            self.namespaces.append(name)
            await self.custom.create_namespaced_custom_object(
                GROUP, VERSION, name, PLURAL, quota(f"eq-{short}", lo, hi)
            )

    async def create(self, pods: Sequence[tuple[str, dict[str, Any]]]) -> None:
        for short, body in pods:
            await self.core.create_namespaced_pod(self.ns(short), cast(client.V1Pod, body))

    async def running(self, pods: Sequence[tuple[str, str]]) -> None:
        """Until every (namespace, pod) is bound and started (kwok)."""

        async def ready() -> bool:
            for short, name in pods:
                p = await self.core.read_namespaced_pod(name, self.ns(short))
                if not p.spec.node_name or p.metadata.deletion_timestamp is not None:
                    return False
            return True

        await poll(ready, within=60, interval=0.3)

    async def alive(self, short: str, name: str) -> Any | None:
        with contextlib.suppress(client.ApiException):
            p = await self.core.read_namespaced_pod(name, self.ns(short))
            return None if p.metadata.deletion_timestamp is not None else p
        return None

    async def reclaim_events(self, short: str) -> dict[str, str]:
        events = await self.core.list_namespaced_event(
            self.ns(short), field_selector="reason=Preempted"
        )
        return {e.involved_object.name: e.message for e in events.items}

    async def teardown(self) -> None:
        """Pods gone first (their room and quota use with them), then quotas, namespaces."""
        for name in self.namespaces:
            await self.core.delete_collection_namespaced_pod(name, grace_period_seconds=0)

        async def empty() -> bool:
            for name in self.namespaces:
                if (await self.core.list_namespaced_pod(name)).items:
                    return False
            return True

        await poll(empty, within=60, interval=0.3)
        for name in self.namespaces:
            with contextlib.suppress(client.ApiException):
                for item in (
                    await self.custom.list_namespaced_custom_object(GROUP, VERSION, name, PLURAL)
                )["items"]:
                    await self.custom.delete_namespaced_custom_object(
                        GROUP, VERSION, name, PLURAL, item["metadata"]["name"]
                    )
                await self.core.delete_namespace(name)


async def outcome(
    case: Case,
    bound: Sequence[tuple[str, str]],
    evicted: Sequence[tuple[str, str]],
    pending: Sequence[tuple[str, str]],
) -> None:
    """The objects say: ``bound`` pods bound, ``evicted`` gone (or terminating), ``pending``
    still without a node once the rest has settled."""
    await case.running(bound)

    async def gone() -> bool:
        for short, name in evicted:
            if await case.alive(short, name) is not None:
                return False
        return True

    await poll(gone, within=30, interval=0.3)
    await asyncio.sleep(2.0)  # a wrong eviction or binding would show by now
    for short, name in pending:
        p = await case.core.read_namespaced_pod(name, case.ns(short))
        assert not p.spec.node_name, f"{name} should stay pending"
    await case.running(bound)  # and nothing bound was evicted meanwhile


async def test_capacity_scheduling_reclaim_cases(plane: Plane, api: client.ApiClient) -> None:
    scheduling = client.SchedulingV1Api(api)
    core = client.CoreV1Api(api)
    for name, value in CLASSES.items():
        pc: dict[str, Any] = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass"}
        pc |= {"metadata": {"name": name}, "value": value}
        with contextlib.suppress(client.ApiException):
            await scheduling.create_priority_class(cast(client.V1PriorityClass, pc))
    nodes = sorted(n.metadata.name for n in (await core.list_node()).items)
    a, b = nodes
    sched = plane.lattice(identity="reclaim").start()
    reclaimed = 0
    try:
        # -- cross-namespace preemption ---------------------------------------------------
        case = Case(api, "cross")
        await case.setup({"ns1": ("4", "8"), "ns2": ("4", "8")})
        await case.create(
            [
                ("ns1", pod("t1-p1", "2", "rc-mid", a)),
                ("ns1", pod("t1-p2", "2", "rc-mid", a)),
                ("ns1", pod("t1-p3", "2", "rc-low", b)),
            ]
        )
        await case.running([("ns1", "t1-p1"), ("ns1", "t1-p2"), ("ns1", "t1-p3")])
        await asyncio.sleep(1.0)  # the scheduler sees them as the quota's use
        await case.create(
            [
                ("ns2", pod("t1-p4", "2", "rc-mid")),
                ("ns2", pod("t1-p5", "2", "rc-mid")),
                ("ns2", pod("t1-p6", "2", "rc-low")),
            ]
        )
        await outcome(
            case,
            bound=[("ns1", "t1-p1"), ("ns1", "t1-p2"), ("ns2", "t1-p4"), ("ns2", "t1-p5")],
            evicted=[("ns1", "t1-p3")],
            pending=[("ns2", "t1-p6")],
        )

        async def announced() -> str | None:
            return (await case.reclaim_events("ns1")).get("t1-p3")

        message = await poll(announced, within=20, interval=0.3)
        assert message.startswith(f"Reclaimed by ElasticQuota {case.ns('ns2')}/eq-ns2 for pod ")
        assert f"quota {case.ns('ns1')}/eq-ns1 used more than its min" in message

        async def held_back() -> str | None:
            # t1-p6 takes ns2 above its min (and its fair share, the mins being the whole
            # cluster): no other quota's pod may go, and its FailedScheduling says so.
            events = await case.core.list_namespaced_event(
                case.ns("ns2"), field_selector="reason=FailedScheduling,involvedObject.name=t1-p6"
            )
            said = [e.message or "" for e in events.items]
            return next((m for m in said if "Reclaim: " in m), None)

        why = await poll(held_back, within=20, interval=0.3)
        assert f"Reclaim: quota {case.ns('ns2')}/eq-ns2 goes above its min with the pod" in why
        assert why.endswith("only its own quota's lower-priority pods may be preempted."), why
        reclaimed += 1
        await case.teardown()

        # -- in-namespace preemption above min --------------------------------------------
        case = Case(api, "inns")
        await case.setup({"ns1": ("4", "8"), "ns2": ("4", "8")})
        await case.create(
            [
                ("ns1", pod("t2-p1", "2", "rc-mid", a)),
                ("ns1", pod("t2-p2", "2", "rc-low", a)),
                ("ns2", pod("t2-p3", "2", "rc-mid", b)),
                ("ns2", pod("t2-p4", "2", "rc-low", b)),
            ]
        )
        await case.running([("ns1", "t2-p1"), ("ns1", "t2-p2"), ("ns2", "t2-p3"), ("ns2", "t2-p4")])
        await asyncio.sleep(1.0)
        await case.create(
            [("ns1", pod("t2-p5", "2", "rc-mid")), ("ns2", pod("t2-p6", "2", "rc-mid"))]
        )
        await outcome(
            case,
            bound=[("ns1", "t2-p1"), ("ns2", "t2-p3"), ("ns1", "t2-p5"), ("ns2", "t2-p6")],
            evicted=[("ns1", "t2-p2"), ("ns2", "t2-p4")],
            pending=[],
        )
        for short, name in (("ns1", "t2-p5"), ("ns2", "t2-p6")):
            p = await case.core.read_namespaced_pod(name, case.ns(short))
            assert p.spec.node_name == (a if short == "ns1" else b)  # its own quota's room
        await case.teardown()

        # -- three quotas: refused at PreFilter although the nodes have room --------------
        case = Case(api, "three")
        await case.setup({"ns1": ("1", "3"), "ns2": ("3", "3"), "ns3": ("3", "4")})
        existing = [
            ("ns1", pod("t7-p1", "1", "rc-high", a)),
            ("ns1", pod("t7-p2", "1", "rc-mid", b)),
            ("ns1", pod("t7-p3", "1", "rc-mid", b)),
            ("ns2", pod("t7-p5", "1", "rc-mid", b)),
            ("ns2", pod("t7-p6", "1", "rc-mid", a)),
            ("ns2", pod("t7-p7", "1", "rc-mid", b)),
        ]
        await case.create(existing)
        await case.running([(s, body["metadata"]["name"]) for s, body in existing])
        await asyncio.sleep(1.0)
        await case.create([("ns3", pod(f"t7-p{i}", "1", "rc-mid")) for i in (9, 10, 11, 12)])
        await outcome(
            case,
            bound=[
                ("ns1", "t7-p1"),
                ("ns2", "t7-p5"),
                ("ns2", "t7-p6"),
                ("ns2", "t7-p7"),
                ("ns3", "t7-p9"),
                ("ns3", "t7-p10"),
                ("ns3", "t7-p11"),
            ],
            evicted=[("ns1", "t7-p2"), ("ns1", "t7-p3")],
            pending=[("ns3", "t7-p12")],
        )
        events = await case.reclaim_events("ns1")
        for name in ("t7-p2", "t7-p3"):
            assert events.get(name, "").startswith(
                f"Reclaimed by ElasticQuota {case.ns('ns3')}/eq-ns3 for pod "
            ), events
        reclaimed += 2
        await case.teardown()
        report_line(
            "reclaim e2e: CapacityScheduling's cross-namespace, in-namespace and three-quota "
            f"cases replayed on 2 kwok nodes, {reclaimed} pods reclaimed across quotas"
        )
    finally:
        sched.stop()


async def test_a_gang_within_its_min_reclaims_what_another_quota_borrowed(
    plane: Plane, api: client.ApiClient
) -> None:
    """Reclaim for a gang: ns1 (min 2 cpu) borrows 4 high-priority pods of 1 cpu, one node
    half full each; ns2's PodGroup of 2 x 2 cpu stays within ns2's min (4), but the sum
    of mins (6) refuses it although the nodes have room for it. Two of ns1's pods go (ns1
    back at its min, no more), each with the reclaim event naming the PodGroup, and the
    gang binds whole."""
    scheduling = client.SchedulingV1Api(api)
    for name, value in CLASSES.items():
        pc: dict[str, Any] = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass"}
        pc |= {"metadata": {"name": name}, "value": value}
        with contextlib.suppress(client.ApiException):
            await scheduling.create_priority_class(cast(client.V1PriorityClass, pc))
    core = client.CoreV1Api(api)
    a, b = sorted(n.metadata.name for n in (await core.list_node()).items)
    sched = plane.lattice(identity="reclaim-gang").start()
    case = Case(api, "gang")
    try:
        await case.setup({"ns1": ("2", "8"), "ns2": ("4", "8")})
        existing = [("ns1", pod(f"t9-p{i}", "1", "rc-high", a if i < 2 else b)) for i in range(4)]
        await case.create(existing)
        await case.running([(s, body["metadata"]["name"]) for s, body in existing])
        await asyncio.sleep(1.0)
        await case.custom.create_namespaced_custom_object(
            *GANG_GROUP[:2],
            case.ns("ns2"),
            GANG_GROUP[2],
            {
                "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": "g"},
                "spec": {"minMember": 2},
            },
        )
        members = []
        for i in range(2):
            body = pod(f"t9-g{i}", "2", "rc-low")
            body["metadata"]["labels"] = {GANG_LABEL: "g"}
            members.append(("ns2", body))
        await case.create(members)
        await case.running([("ns2", "t9-g0"), ("ns2", "t9-g1")])

        async def two_gone() -> list[str] | None:
            alive = [
                n for _, body in existing if await case.alive("ns1", n := body["metadata"]["name"])
            ]
            return alive if len(alive) == 2 else None

        left = await poll(two_gone, within=30, interval=0.3)
        events = await case.reclaim_events("ns1")
        gone = {body["metadata"]["name"] for _, body in existing} - set(left)
        for name in gone:
            assert events.get(name, "").startswith(
                f"Reclaimed by ElasticQuota {case.ns('ns2')}/eq-ns2 for PodGroup "
                f"{case.ns('ns2')}/g on node "
            ), events
        await asyncio.sleep(2.0)  # no further eviction shows by now
        assert len([n for n in left if await case.alive("ns1", n)]) == 2
        await case.teardown()
    finally:
        sched.stop()

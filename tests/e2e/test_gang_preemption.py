"""Gang preemption end to end: `lattice run` (with the shipped RBAC) on 4 full kwok nodes.

Every node (4 cpu) holds one 2-cpu member of a low-priority gang ``lo`` (a PodGroup of
minMember 4) and two 1-cpu low-priority single pods, all bound directly (no scheduler
placed them). Then, read back from the API server:

1. a high-priority gang of 5 members of 4 cpu, which cannot fit even if every
   lower-priority pod were gone: nothing is evicted, the members say why;
2. a high-priority gang of 4 members of 2 cpu, which fits only if pods are evicted: either
   the whole ``lo`` gang goes (4 pods) or eight singles would; the cheaper is the gang, so
   exactly its four members are deleted (each with ``DisruptionTarget`` and a
   ``Preempted`` Event naming the PodGroup), never one to three of them, no single pod is
   touched, the members are nominated, the PodGroup gets a ``Preempting`` Event, and all
   four high-priority members end bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any, cast

import pytest
from kubernetes_asyncio import client

from lattice_dev.devcluster.cluster import ClusterConfig
from lattice_dev.devcluster.kube import poll
from tests.conftest import report_line
from tests.e2e.test_preemption import Recorder, raw_list
from tests.e2e.test_scheduler import Plane, lattice_plane

NODES = 4
GROUP = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")
LABEL = "scheduling.x-k8s.io/pod-group"
CLASSES = {"gp-low": 10, "gp-high": 1000}

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    config = ClusterConfig(nodes=NODES, node_profile="small")  # 4 cpu each
    with lattice_plane(tmp_path_factory.mktemp("gangpreemptplane"), config) as p:
        yield p


def body(
    name: str, cpu: str, klass: str, *, node: str | None = None, group: str | None = None
) -> dict[str, Any]:
    labels = {"app": name.split("-", 1)[0]}
    if group is not None:
        labels[LABEL] = group
    spec: dict[str, Any] = {
        "schedulerName": "lattice",
        "priorityClassName": klass,
        "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}],
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }


async def create_group(api: client.ApiClient, ns: str, name: str, min_member: int) -> None:
    group = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"minMember": min_member},
    }
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        *GROUP[:2], ns, GROUP[2], group
    )


async def test_a_gang_preempts_a_whole_lower_gang_only_when_it_then_fits(
    plane: Plane, api: client.ApiClient, ns: str
) -> None:
    core = client.CoreV1Api(api)
    scheduling = client.SchedulingV1Api(api)
    for name, value in CLASSES.items():
        pc: dict[str, Any] = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass"}
        pc |= {"metadata": {"name": name}, "value": value}
        with contextlib.suppress(client.ApiException):
            await scheduling.create_priority_class(cast(client.V1PriorityClass, pc))
    nodes = sorted(n["metadata"]["name"] for n in await raw_list(core.list_node))
    assert len(nodes) == NODES
    await create_group(api, ns, "lo", 4)
    low = [body(f"lo-{i}", "2", "gp-low", node=node, group="lo") for i, node in enumerate(nodes)]
    low += [
        body(f"single-{i}-{j}", "1", "gp-low", node=node)
        for i, node in enumerate(nodes)
        for j in range(2)
    ]
    for b in low:
        await core.create_namespaced_pod(ns, cast(client.V1Pod, b))
    low_names = {b["metadata"]["name"] for b in low}
    lo_names = {f"lo-{i}" for i in range(NODES)}

    async def running() -> bool:
        pods = await raw_list(core.list_namespaced_pod, ns)
        return len([p for p in pods if (p.get("status") or {}).get("startTime")]) == len(low)

    await poll(running, within=90, interval=0.3)
    recorder = Recorder(api, ns)
    recorder.start()
    sched = plane.lattice(identity="gang-preemption").start()
    try:
        await asyncio.sleep(3.0)  # the scheduler syncs its streams (gangs, start times)

        # 1. Cannot fit even with every lower-priority pod gone: nobody is evicted.
        await create_group(api, ns, "big", 5)
        big = [body(f"big-{i}", "4", "gp-high", group="big") for i in range(5)]
        for b in big:
            await core.create_namespaced_pod(ns, cast(client.V1Pod, b))

        async def refused() -> bool:
            events = await core.list_namespaced_event(ns, field_selector="reason=FailedScheduling")
            said = {
                e.involved_object.name
                for e in events.items
                if "preemption: the gang does not fit even with every lower-priority pod evicted"
                in e.message
            }
            return {b["metadata"]["name"] for b in big} <= said

        await poll(refused, within=60, interval=0.3)
        await asyncio.sleep(3.0)  # a wrong eviction would have been written by now
        pods = {p["metadata"]["name"]: p for p in await raw_list(core.list_namespaced_pod, ns)}
        assert low_names <= set(pods)
        assert not any(pods[n]["metadata"].get("deletionTimestamp") for n in low_names)
        assert not any(recorder.disruption_target(n) for n in low_names)
        preempted = await core.list_namespaced_event(ns, field_selector="reason=Preempted")
        assert not preempted.items
        assert not any(pods[b["metadata"]["name"]]["spec"].get("nodeName") for b in big)
        for b in big:
            await core.delete_namespaced_pod(b["metadata"]["name"], ns, grace_period_seconds=0)
        await client.CustomObjectsApi(api).delete_namespaced_custom_object(
            *GROUP[:2], ns, GROUP[2], "big"
        )

        async def big_gone() -> bool:
            names = {p["metadata"]["name"] for p in await raw_list(core.list_namespaced_pod, ns)}
            return not any(n.startswith("big-") for n in names)

        await poll(big_gone, within=60, interval=0.3)

        # 2. Fits only by eviction: the whole lower gang goes, nothing else, and it binds.
        await create_group(api, ns, "hi", 4)
        hi = [body(f"hi-{i}", "2", "gp-high", group="hi") for i in range(4)]
        hi_names = {b["metadata"]["name"] for b in hi}
        for b in hi:
            await core.create_namespaced_pod(ns, cast(client.V1Pod, b))

        async def all_bound() -> dict[str, str] | None:
            pods = await raw_list(core.list_namespaced_pod, ns)
            placed = {
                p["metadata"]["name"]: p["spec"]["nodeName"]
                for p in pods
                if p["metadata"]["name"] in hi_names and p["spec"].get("nodeName")
            }
            return placed if len(placed) == len(hi_names) else None

        placed = await poll(all_bound, within=120, interval=0.3)
        assert placed is not None
        pods = {p["metadata"]["name"]: p for p in await raw_list(core.list_namespaced_pod, ns)}
        gone = {
            n for n in low_names if n not in pods or pods[n]["metadata"].get("deletionTimestamp")
        }
        lo_gone = gone & lo_names
        assert len(lo_gone) in (0, NODES), f"part of a gang was preempted: {sorted(lo_gone)}"
        assert gone == lo_names, sorted(gone)  # the gang, whole, is the cheaper victim set
        for victim in lo_names:
            cond = recorder.disruption_target(victim)
            assert cond is not None, f"{victim} had no DisruptionTarget"
            assert cond.reason == "PreemptionByScheduler"
        for name in hi_names:
            assert recorder.nominated(name) is not None, f"{name} was never nominated"

        async def announced() -> bool:
            events = await core.list_namespaced_event(ns, field_selector="reason=Preempted")
            said = {
                e.involved_object.name
                for e in events.items
                if e.message.startswith(f"Preempted by PodGroup {ns}/hi on node ")
                and e.type == "Normal"
            }
            return lo_names <= said

        await poll(announced, within=30, interval=0.3)

        async def group_event() -> Any:
            events = await core.list_namespaced_event(ns, field_selector="reason=Preempting")
            for e in events.items:
                if e.involved_object.kind == "PodGroup" and e.involved_object.name == "hi":
                    return e
            return None

        event = await poll(group_event, within=30, interval=0.3)
        assert "preempting 4 lower-priority pods" in event.message
        report_line(
            f"gang preemption e2e: {NODES} full nodes; a gang that cannot fit evicted nobody; "
            f"a gang of 4 preempted the whole lower gang (4 pods, no single) and bound"
        )
    finally:
        sched.stop()
        await recorder.stop()

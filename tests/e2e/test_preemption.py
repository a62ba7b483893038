"""Preemption end to end: `lattice run` (with the shipped RBAC) on a full 10-node cluster.

Every node is full of lower-priority pods (bound directly, so no scheduler placed them):
node 0's are the cheapest victims (lowest priority) but a PodDisruptionBudget allows none
of them to go; the others hold two "low" and two "mid" pods each. Three high-priority pods
are then created one by one. Before each, the cluster is read back and the pure evaluator
(:func:`scheduler.core.preemption.preempt`) run on it; the pod must then be bound to a node
the evaluator found best (kube breaks the last tie at random), after exactly the victims it
chose there, each of which carried ``DisruptionTarget`` (PreemptionByScheduler) before it
went and got a ``Preempted`` Event; the preemptor got ``nominatedNodeName``. The budget's
pods are never evicted, though they would be the cheapest choice without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any, cast

import pytest
from kubernetes_asyncio import client, watch

from lattice_dev.devcluster.cluster import ClusterConfig
from lattice_dev.devcluster.kube import poll
from scheduler.core.from_api import as_pending, snapshot_from_api
from scheduler.core.preemption import Inputs, preempt
from scheduler.core.schedule import Framework
from scheduler.model.pdb import PodDisruptionBudget
from scheduler.model.pod import Pod
from scheduler.model.pod_facts import PodFacts
from tests.conftest import report_line
from tests.e2e.test_scheduler import Plane, lattice_plane

NODES = 10
CLASSES = {"pe-guarded": 5, "pe-low": 10, "pe-mid": 20, "pe-high": 1000}

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    config = ClusterConfig(nodes=NODES, node_profile="small")  # 4 cpu each
    with lattice_plane(tmp_path_factory.mktemp("preemptplane"), config) as p:
        yield p


def body(name: str, cpu: str, klass: str, *, node: str | None = None, app: str) -> dict[str, Any]:
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
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": spec,
    }


async def raw_list(call: Any, *args: Any) -> list[dict[str, Any]]:
    response: Any = await call(*args, _preload_content=False)
    items: list[dict[str, Any]] = json.loads(await response.read())["items"]
    return items


class Recorder:
    """Every pod body the namespace's watch shows, by name (victims are gone quickly)."""

    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.core = client.CoreV1Api(api)
        self.ns = ns
        self.seen: dict[str, list[Any]] = {}
        self.task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(client.ApiException, asyncio.TimeoutError):
                async with watch.Watch().stream(
                    self.core.list_namespaced_pod, self.ns, timeout_seconds=30
                ) as stream:
                    async for event in stream:
                        pod = event["object"]
                        self.seen.setdefault(pod.metadata.name, []).append(pod)

    def start(self) -> None:
        self.task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    def disruption_target(self, name: str) -> Any:
        for pod in self.seen.get(name, []):
            for cond in pod.status.conditions or []:
                if cond.type == "DisruptionTarget" and cond.status == "True":
                    return cond
        return None

    def nominated(self, name: str) -> str | None:
        for pod in self.seen.get(name, []):
            if pod.status.nominated_node_name:
                return str(pod.status.nominated_node_name)
        return None


async def test_high_priority_pods_preempt_the_victims_the_evaluator_chooses(
    plane: Plane, api: client.ApiClient, ns: str
) -> None:
    core = client.CoreV1Api(api)
    scheduling = client.SchedulingV1Api(api)
    policy = client.PolicyV1Api(api)
    for name, value in CLASSES.items():
        pc: dict[str, Any] = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass"}
        pc |= {"metadata": {"name": name}, "value": value}
        with contextlib.suppress(client.ApiException):
            await scheduling.create_priority_class(cast(client.V1PriorityClass, pc))
    nodes = sorted(n["metadata"]["name"] for n in await raw_list(core.list_node))
    assert len(nodes) == NODES
    low: list[dict[str, Any]] = []
    for i, node in enumerate(nodes):
        for j in range(4):
            if i == 0:
                low.append(body(f"guarded-{j}", "1", "pe-guarded", node=node, app="guarded"))
            else:
                klass = "pe-low" if j < 2 else "pe-mid"
                low.append(body(f"{klass[3:]}-{i}-{j}", "1", klass, node=node, app=klass))
    for b in low:  # one by one: distinct start times are likelier
        await core.create_namespaced_pod(ns, cast(client.V1Pod, b))
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded"},
        "spec": {"minAvailable": 4, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    await policy.create_namespaced_pod_disruption_budget(
        ns, cast(client.V1PodDisruptionBudget, budget)
    )

    async def settled() -> bool:
        pods = await raw_list(core.list_namespaced_pod, ns)
        running = [p for p in pods if (p.get("status") or {}).get("startTime")]
        pdb = await policy.read_namespaced_pod_disruption_budget("guarded", ns)
        st = pdb.status
        return (
            len(running) == len(low)
            and st is not None
            and st.current_healthy == 4
            and st.disruptions_allowed == 0
            and (st.observed_generation or 0) >= (pdb.metadata.generation or 0)
        )

    await poll(settled, within=90, interval=0.3)
    recorder = Recorder(api, ns)
    recorder.start()
    sched = plane.lattice(identity="preemption").start()
    try:
        await asyncio.sleep(3.0)  # the scheduler syncs its streams (budgets, start times)
        evicted: set[str] = set()
        for k in range(3):
            name = f"high-{k}"
            before_nodes, before_pods, before_ns, before_pdbs = await asyncio.gather(
                raw_list(core.list_node),
                raw_list(core.list_pod_for_all_namespaces),
                raw_list(core.list_namespace),
                raw_list(policy.list_pod_disruption_budget_for_all_namespaces),
            )
            created: Any = await core.create_namespaced_pod(
                ns,
                cast(client.V1Pod, body(name, "2", "pe-high", app="high")),
                _preload_content=False,
            )
            stored = json.loads(await created.read())
            built = snapshot_from_api(before_nodes, before_pods, before_ns)
            pod = Pod.from_api(as_pending(stored))
            facts = {Pod.from_api(b).key: PodFacts.from_api(b) for b in before_pods}
            framework = Framework()
            decision = framework.schedule(built.snapshot, pod)
            assert decision.selected is None, "the cluster is full"
            pdbs = [PodDisruptionBudget.from_api(b) for b in before_pdbs]
            found = preempt(framework, built.snapshot, decision, Inputs(pdbs=pdbs, facts=facts))
            assert found is not None

            async def placed(name: str = name) -> str | None:
                p = await core.read_namespaced_pod(name, ns)
                return p.spec.node_name or None

            node = await poll(placed, within=90, interval=0.3)
            assert node in found.tied, (node, found.tied)
            (on_node,) = [c for c in found.candidates if c.node == node]
            expected = {v.name for v in on_node.victims}
            pods = {p["metadata"]["name"]: p for p in await raw_list(core.list_namespaced_pod, ns)}
            gone = {
                b["metadata"]["name"]
                for b in low
                if b["metadata"]["name"] not in pods
                or pods[b["metadata"]["name"]]["metadata"].get("deletionTimestamp")
            }
            victims = gone - evicted
            assert victims == expected, (node, victims, expected)
            evicted |= victims
            for victim in victims:
                cond = recorder.disruption_target(victim)
                assert cond is not None, f"{victim} had no DisruptionTarget"
                assert cond.reason == "PreemptionByScheduler"
                assert cond.message == "lattice: preempting to accommodate a higher priority pod"

            async def nominated(name: str = name) -> str | None:
                return recorder.nominated(name)

            assert await poll(nominated, within=10, interval=0.2) == node

            async def announced(
                uid: str = stored["metadata"]["uid"], node: str = node, victims: set[str] = victims
            ) -> bool:
                events = await core.list_namespaced_event(ns, field_selector="reason=Preempted")
                said = {
                    e.involved_object.name
                    for e in events.items
                    if e.message == f"Preempted by pod {uid} on node {node}" and e.type == "Normal"
                }
                return victims <= said

            await poll(announced, within=30, interval=0.3)
        assert not any(v.startswith("guarded") for v in evicted)
        assert all(v.startswith("low-") for v in evicted)  # never a mid pod: lows suffice
        report_line(
            f"preemption e2e: 3 preemptors on {NODES} full nodes, {len(evicted)} victims as "
            "the evaluator chose; the budget's pods kept"
        )
    finally:
        sched.stop()
        await recorder.stop()

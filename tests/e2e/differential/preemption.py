"""Drive kube-scheduler's DefaultPreemption through generated cases and record what it did.

One round runs many cases at once (one namespace and node pool each, see
``preemption_gen``): create nodes and wait until they are Ready and untainted, create the
low-priority pods' pre-bound volumes and claims and wait until the PV controller has bound
every pair, create the pods bound to the nodes and wait until kwok runs them (their
``startTime`` is one of preemption's criteria), create the budgets and wait until the
disruption controller has counted every pod, read the whole cluster back, and only then
create the preemptors. For each preemptor kube-scheduler either nominates a node and
deletes victims (patching the ``DisruptionTarget`` condition first; kwok then removes them
and the preemptor binds), or reports why preemption does not help in its FailedScheduling
condition.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar, cast

from kubernetes_asyncio import client

from lattice_dev.devcluster.kube import poll
from tests.e2e.differential.preemption_gen import Body, Case, priority_classes, static_class

T = TypeVar("T")
_CONCURRENCY = 32


@dataclass(frozen=True)
class KubePreemption:
    """kube-scheduler's verdict on one preemptor."""

    node: str | None
    """The nominated node (or, if the preemptor was bound already, the node it went to)."""
    victims: frozenset[str]
    """Names of the case's pods kube-scheduler preempted on ``node``."""
    bound: str | None
    message: str | None
    """The FailedScheduling condition's message, when there was one."""
    elsewhere: frozenset[str] = frozenset()
    """Pods it preempted on other nodes. One attempt evicts on one node only, so these come
    from an earlier attempt made on a view its informers had not caught up with yet (seen
    only under load: seed 184492022 evicted n2-p2 this way once in CI, never when rerun);
    the final attempt, on the full view, is the verdict compared."""


@dataclass
class Before:
    """The cluster as the API server had it just before the preemptors were created."""

    nodes: list[Body]
    pods: list[Body]
    namespaces: list[Body]
    pdbs: list[Body]
    pvs: list[Body]
    pvcs: list[Body]
    classes: list[Body]


async def _bounded(jobs: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    gate = asyncio.Semaphore(_CONCURRENCY)

    async def one(job: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await job()

    return list(await asyncio.gather(*(one(j) for j in jobs)))


class PreemptionKubeSide:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.policy = client.PolicyV1Api(api)
        self.scheduling = client.SchedulingV1Api(api)
        self.storage = client.StorageV1Api(api)
        self.nominee_seconds = 0.0
        """Spent creating nominees and waiting for their first failure."""

    async def install_priority_classes(self) -> None:
        """The PriorityClasses and the StorageClass every case uses."""
        for body in priority_classes():
            try:
                await self.scheduling.create_priority_class(cast(client.V1PriorityClass, body))
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
        try:
            await self.storage.create_storage_class(cast(client.V1StorageClass, static_class()))
        except client.ApiException as exc:
            if exc.status != 409:
                raise

    async def prepare(self, cases: Sequence[Case]) -> Before:
        await _bounded(
            [
                partial(
                    self.core.create_namespace,
                    cast(client.V1Namespace, {"metadata": {"name": c.namespace}}),
                )
                for c in cases
            ]
        )
        nodes = [n for c in cases for n in c.nodes]
        await _bounded([partial(self.core.create_node, cast(client.V1Node, n)) for n in nodes])
        await self._nodes_ready({n["metadata"]["name"] for n in nodes})
        await self._volumes(cases)
        pods = [p for c in cases for p in c.pods]
        await _bounded(
            [
                partial(
                    self.core.create_namespaced_pod,
                    p["metadata"]["namespace"],
                    cast(client.V1Pod, p),
                )
                for p in pods
            ]
        )
        await self._pods_running(cases)
        pdbs = [b for c in cases for b in c.pdbs]
        await _bounded(
            [
                partial(
                    self.policy.create_namespaced_pod_disruption_budget,
                    b["metadata"]["namespace"],
                    cast(client.V1PodDisruptionBudget, b),
                )
                for b in pdbs
            ]
        )
        await self._budgets_counted(cases)
        started = asyncio.get_running_loop().time()
        await self._nominees(cases)
        self.nominee_seconds += asyncio.get_running_loop().time() - started
        # The scheduler's informers trail the API server by milliseconds; budgets have no
        # sentinel like pods do, so give them a moment.
        await asyncio.sleep(1.0)
        return await self._read()

    async def _nominees(self, cases: Sequence[Case]) -> None:
        """Create each case's nominee, let kube-scheduler fail it once (it can fit nowhere
        and may not preempt), then write its nominatedNodeName, as a preemption would."""
        with_nominee = [c for c in cases if c.nominee is not None]
        await _bounded(
            [
                partial(self.core.create_namespaced_pod, c.namespace, cast(client.V1Pod, c.nominee))
                for c in with_nominee
            ]
        )

        async def failed(c: Case) -> bool:
            pod = await self.core.read_namespaced_pod("nominee", c.namespace)
            return any(
                cond.type == "PodScheduled" and cond.status == "False"
                for cond in pod.status.conditions or []
            )

        await asyncio.gather(
            *(poll(partial(failed, c), within=60, interval=0.1) for c in with_nominee)
        )
        patch = [
            partial(
                self.core.patch_namespaced_pod_status,
                "nominee",
                c.namespace,
                {"status": {"nominatedNodeName": c.nominee_node}},
            )
            for c in with_nominee
        ]
        await _bounded(patch)

    async def _volumes(self, cases: Sequence[Case]) -> None:
        """The cases' pre-bound pairs, bound by the PV controller before any pod exists."""
        pvs = [v for c in cases for v in c.pvs]
        if not pvs:
            return
        await _bounded(
            [
                partial(self.core.create_persistent_volume, cast(client.V1PersistentVolume, v))
                for v in pvs
            ]
        )
        names = {v["metadata"]["name"] for v in pvs}

        async def phase_of_pvs() -> dict[str, str]:
            items = await self._raw(self.core.list_persistent_volume)
            return {
                v["metadata"]["name"]: (v.get("status") or {}).get("phase", "")
                for v in items
                if v["metadata"]["name"] in names
            }

        # Claims only once every PV has its first phase: a claim bound while the controller
        # writes that status conflicts, and the retry waits for its 15 s resync.
        async def phased() -> bool:
            phases = await phase_of_pvs()
            return len(phases) == len(names) and all(phases.values())

        await poll(phased, within=60, interval=0.2)
        await _bounded(
            [
                partial(
                    self.core.create_namespaced_persistent_volume_claim,
                    c.namespace,
                    cast(client.V1PersistentVolumeClaim, claim),
                )
                for c in cases
                for claim in c.pvcs
            ]
        )
        want = {(c.namespace, claim["metadata"]["name"]) for c in cases for claim in c.pvcs}

        async def bound() -> bool:
            items = await self._raw(self.core.list_persistent_volume_claim_for_all_namespaces)
            done = {
                (b["metadata"]["namespace"], b["metadata"]["name"])
                for b in items
                if (b.get("status") or {}).get("phase") == "Bound"
            }
            return want <= done

        await poll(bound, within=90, interval=0.25)

    async def _nodes_ready(self, names: set[str]) -> None:
        async def ready() -> bool:
            mine = [n for n in (await self.core.list_node()).items if n.metadata.name in names]
            return len(mine) == len(names) and all(
                not any(t.key == "node.kubernetes.io/not-ready" for t in (n.spec.taints or []))
                and any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
                for n in mine
            )

        await poll(ready, within=90, interval=0.25)

    async def _pods_running(self, cases: Sequence[Case]) -> None:
        want = {c.namespace: len(c.pods) for c in cases}

        async def running() -> bool:
            pods = (await self.core.list_pod_for_all_namespaces()).items
            count: dict[str, int] = {}
            for p in pods:
                ns = p.metadata.namespace
                if ns in want and p.status.phase == "Running" and p.status.start_time:
                    count[ns] = count.get(ns, 0) + 1
            return all(count.get(ns, 0) == n for ns, n in want.items())

        await poll(running, within=90, interval=0.25)

    async def _budgets_counted(self, cases: Sequence[Case]) -> None:
        expected: dict[tuple[str, str], int] = {}
        for c in cases:
            for b in c.pdbs:
                app = b["spec"]["selector"]["matchLabels"]["app"]
                expected[(c.namespace, b["metadata"]["name"])] = sum(
                    p["metadata"]["labels"]["app"] == app for p in c.pods
                )

        async def counted() -> bool:
            items = (await self.policy.list_pod_disruption_budget_for_all_namespaces()).items
            seen = 0
            for b in items:
                key = (b.metadata.namespace, b.metadata.name)
                if key not in expected:
                    continue
                st = b.status
                if (
                    st is None
                    or (st.observed_generation or 0) < (b.metadata.generation or 0)
                    or st.expected_pods != expected[key]
                    or st.current_healthy != expected[key]
                ):
                    return False
                seen += 1
            return seen == len(expected)

        await poll(counted, within=90, interval=0.25)

    async def _raw(self, call: Callable[..., Awaitable[Any]]) -> list[Body]:
        response: Any = await call(_preload_content=False)
        items: list[Body] = json.loads(await response.read())["items"]
        return items

    async def _read(self) -> Before:
        nodes, pods, namespaces, pdbs, pvs, pvcs, classes = await asyncio.gather(
            self._raw(self.core.list_node),
            self._raw(self.core.list_pod_for_all_namespaces),
            self._raw(self.core.list_namespace),
            self._raw(self.policy.list_pod_disruption_budget_for_all_namespaces),
            self._raw(self.core.list_persistent_volume),
            self._raw(self.core.list_persistent_volume_claim_for_all_namespaces),
            self._raw(self.storage.list_storage_class),
        )
        return Before(nodes, pods, namespaces, pdbs, pvs, pvcs, classes)

    async def preempt(self, cases: Sequence[Case]) -> tuple[list[Body], list[KubePreemption]]:
        """Create every preemptor; return them as stored (after admission) and the verdicts."""
        created = await _bounded(
            [
                partial(
                    self.core.create_namespaced_pod,
                    c.namespace,
                    cast(client.V1Pod, c.preemptor),
                    _preload_content=False,
                )
                for c in cases
            ]
        )
        bodies: list[Body] = [json.loads(await cast(Any, r).read()) for r in created]
        verdicts = await asyncio.gather(*(self._verdict(c) for c in cases))
        return bodies, list(verdicts)

    async def _verdict(self, case: Case) -> KubePreemption:
        ns = case.namespace
        originals = {p["metadata"]["name"] for p in case.pods}

        async def decided() -> tuple[str | None, str | None, str | None] | None:
            pod = await self.core.read_namespaced_pod("preemptor", ns)
            nominated = pod.status.nominated_node_name or None
            if pod.spec.node_name or nominated:
                return pod.spec.node_name, nominated, None
            for cond in pod.status.conditions or []:
                if cond.type == "PodScheduled" and cond.status == "False" and cond.message:
                    return None, None, str(cond.message)
            return None

        bound, nominated, message = await poll(decided, within=60, interval=0.1)
        if bound is None and nominated is None:
            # A failure without a nomination is final; look once more in case a retry raced.
            await asyncio.sleep(1.0)
            again = await decided()
            assert again is not None
            bound, nominated, message = again
        if nominated is not None and bound is None:

            async def placed() -> str | None:
                pod = await self.core.read_namespaced_pod("preemptor", ns)
                return pod.spec.node_name or None

            bound = await poll(placed, within=60, interval=0.1)
        victims = await self._victims(ns, originals)
        node = nominated or (bound if victims else None)
        where = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in case.pods}
        here = frozenset(v for v in victims if node is None or where.get(v) == node)
        return KubePreemption(node, here, bound, message, victims - here)

    async def _victims(self, ns: str, originals: set[str]) -> frozenset[str]:
        pods: list[Any] = (await self.core.list_namespaced_pod(ns)).items
        alive: set[str] = set()
        for p in pods:
            preempted = p.metadata.deletion_timestamp is not None or any(
                c.type == "DisruptionTarget" and c.status == "True"
                for c in p.status.conditions or []
            )
            if not preempted:
                alive.add(p.metadata.name)
        return frozenset(originals - alive)

    async def teardown(self, cases: Sequence[Case]) -> None:
        """Pods first, at once (grace 0): left to their nodes' deletion they linger as
        terminating pods and namespaces, and every later round's lists grow with them."""
        await _bounded(
            [
                partial(
                    self.core.delete_collection_namespaced_pod, c.namespace, grace_period_seconds=0
                )
                for c in cases
            ]
        )
        await _bounded(
            [partial(self.core.delete_node, n["metadata"]["name"]) for c in cases for n in c.nodes]
        )
        await _bounded([partial(self.core.delete_namespace, c.namespace) for c in cases])
        await _bounded(
            [
                partial(self.core.delete_persistent_volume, v["metadata"]["name"])
                for c in cases
                for v in c.pvs
            ]
        )

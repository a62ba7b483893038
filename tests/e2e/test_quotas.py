"""ElasticQuota admission end to end: `lattice run` on a real control plane (with
kube-scheduler beside it) and our CRDs, under the RBAC we ship.

The scenarios of scheduler-plugins' ``test/integration/capacity_scheduling_test.go`` whose
outcome is decided by CapacityScheduling's admission (PreFilter) are replayed on the same
two nodes (cpu 100, memory 100 bytes, 32 pods) with the same quotas and pods, and the
outcome is read from the objects: which pods are bound, which wait with which reason, and
that no pod was evicted. The cases whose outcome needs CapacityScheduling's preemption
(reclaim) are not replayed here: reclaim is not implemented on this branch. Beside them:
borrowing up to the sum of mins, kube-scheduler's pods in a quota namespace counted as used,
``status.used`` written, and the usage rebuilt after a restart of Lattice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any, cast

import pytest
from kubernetes_asyncio import client

from lattice_dev.devcluster.cluster import ClusterConfig
from lattice_dev.devcluster.kube import create_nodes, node_is_ready, poll
from lattice_dev.devcluster.profiles import get_profile
from scheduler.cli import main
from tests.e2e.lattice_proc import LatticeProcess
from tests.e2e.test_scheduler import Plane, lattice_plane

EQ = ("scheduling.x-k8s.io", "v1alpha1", "elasticquotas")
NODES = ("fake-node-1", "fake-node-2")
MARK = "lattice.test/quota"
CLASSES = {"cs-low": 10, "cs-mid": 100, "cs-high": 1000}
UPSTREAM_QUOTA = {"min": {"memory": "100", "cpu": "100m"}, "max": {"memory": "200", "cpu": "200m"}}

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    config = ClusterConfig(nodes=0, with_kube_scheduler=True)
    with lattice_plane(tmp_path_factory.mktemp("quotaplane"), config) as p:
        yield p


@pytest.fixture(scope="module")
async def cluster(plane: Plane, api: client.ApiClient) -> None:
    """upstream's two nodes (labelled, so the scenario's pods stay on them) and its three
    priorities."""
    bodies = []
    for name in NODES:
        body = get_profile("small").node_body(name, 0)
        body["metadata"]["labels"][MARK] = "yes"
        capacity = {"cpu": "100", "memory": "100", "pods": "32"}
        body["status"]["capacity"] = dict(capacity)
        body["status"]["allocatable"] = dict(capacity)
        bodies.append(body)
    await create_nodes(api, bodies)
    core = client.CoreV1Api(api)

    async def ready() -> bool | None:
        got = [await core.read_node(n) for n in NODES]
        return True if all(node_is_ready(n) for n in got) else None

    await poll(ready, within=60, interval=0.2)
    scheduling = client.SchedulingV1Api(api)
    for name, value in CLASSES.items():
        pc = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass"}
        pc |= {"metadata": {"name": name}, "value": value}  # type: ignore[dict-item]
        with contextlib.suppress(client.ApiException):
            await scheduling.create_priority_class(cast(client.V1PriorityClass, pc))


@pytest.fixture(scope="module")
def sched(plane: Plane, cluster: None) -> Iterator[LatticeProcess]:
    proc = plane.lattice(identity="quotas").start()
    yield proc
    proc.stop()


def make_pod(
    name: str, memory: int, cpu_milli: int, klass: str, node: str = "", scheduler: str = "lattice"
) -> dict[str, Any]:
    """upstream's ``util.MakePod``: memory in bytes, cpu in millicores; a node name binds
    it without any scheduler."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "priorityClassName": klass,
        "terminationGracePeriodSeconds": 0,
        "nodeSelector": {MARK: "yes"},
        "containers": [
            {
                "name": "pause",
                "image": "registry.k8s.io/pause",
                "resources": {"requests": {"memory": str(memory), "cpu": f"{cpu_milli}m"}},
            }
        ],
    }
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def create_quota(api: client.ApiClient, ns: str, name: str, spec: dict[str, Any]) -> None:
    body = {"apiVersion": "/".join(EQ[:2]), "kind": "ElasticQuota", "metadata": {"name": name}}
    body["spec"] = spec
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        EQ[0], EQ[1], ns, EQ[2], body
    )


async def read_pod(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    raw: Any = await client.CoreV1Api(api).read_namespaced_pod(name, ns, _preload_content=False)
    body: dict[str, Any] = json.loads(await raw.read())
    return body


async def bound(api: client.ApiClient, ns: str, name: str, within: float = 30) -> str:
    async def probe() -> str | None:
        node = (await read_pod(api, ns, name))["spec"].get("nodeName")
        return str(node) if node else None

    return await poll(probe, within=within, interval=0.2)


async def refused(api: client.ApiClient, ns: str, name: str, within: float = 30) -> str:
    """The PodScheduled=False message of a pod Lattice refused (still unbound)."""

    async def probe() -> str | None:
        pod = await read_pod(api, ns, name)
        assert not pod["spec"].get("nodeName"), f"{ns}/{name} was bound"
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return str(cond.get("message", ""))
        return None

    return await poll(probe, within=within, interval=0.2)


@contextlib.asynccontextmanager
async def namespaces(api: client.ApiClient, *names: str) -> AsyncIterator[list[str]]:
    """Fresh namespaces; their quotas and pods are deleted after (quotas first, and gone,
    so the next case's sum of mins is its own)."""
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    for n in names:
        await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": n}}))
    try:
        yield list(names)
    finally:
        for n in names:
            listed = await custom.list_namespaced_custom_object(EQ[0], EQ[1], n, EQ[2])
            for item in listed.get("items", []):
                await custom.delete_namespaced_custom_object(
                    EQ[0], EQ[1], n, EQ[2], item["metadata"]["name"]
                )
            await core.delete_collection_namespaced_pod(n, grace_period_seconds=0)

        async def gone() -> bool:
            for n in names:
                if (await core.list_namespaced_pod(n)).items:
                    return False
                if (await custom.list_namespaced_custom_object(EQ[0], EQ[1], n, EQ[2]))["items"]:
                    return False
            return True

        await poll(gone, within=60, interval=0.3)
        for n in names:
            await core.delete_namespace(n)


async def create(api: client.ApiClient, ns: str, *bodies: dict[str, Any]) -> None:
    core = client.CoreV1Api(api)
    for b in bodies:
        await core.create_namespaced_pod(ns, cast(client.V1Pod, b))


async def run_case(
    api: client.ApiClient,
    quotas: dict[str, dict[str, Any]],
    exist: dict[str, list[dict[str, Any]]],
    add: dict[str, list[dict[str, Any]]],
) -> None:
    """upstream's loop: quotas, then the existing (bound) pods, then the added ones."""
    for ns, spec in quotas.items():
        await create_quota(api, ns, f"eq-{ns.rsplit('-', 1)[-1]}", spec)
    for ns, pods in exist.items():
        await create(api, ns, *pods)
    for ns, pods in exist.items():
        for p in pods:
            await bound(api, ns, p["metadata"]["name"])
    await asyncio.sleep(1.0)  # Lattice's watch has the quotas and the bound pods
    for ns, pods in add.items():
        await create(api, ns, *pods)


async def still_there(api: client.ApiClient, ns: str, names: list[str]) -> None:
    """No pod was evicted: every one is there, bound and not being deleted."""
    for name in names:
        pod = await read_pod(api, ns, name)
        assert pod["spec"].get("nodeName"), name
        assert not pod["metadata"].get("deletionTimestamp"), name


async def test_max_and_min_refuse_where_no_node_could_be_freed(
    sched: LatticeProcess, api: client.ApiClient
) -> None:
    """upstream's "in-namespace preemption failed because it can't find node which is
    suitable for preemption": ns1's pod would pass its max, ns2's the sum of mins."""
    async with namespaces(api, "t4-ns1", "t4-ns2") as (ns1, ns2):
        n1, n2 = NODES
        await run_case(
            api,
            {ns1: UPSTREAM_QUOTA, ns2: UPSTREAM_QUOTA},
            {
                ns1: [
                    make_pod("t4-p1", 50, 10, "cs-mid", n1),
                    make_pod("t4-p2", 50, 10, "cs-mid", n1),
                    make_pod("t4-p3", 50, 10, "cs-low", n2),
                ],
                ns2: [make_pod("t4-p4", 50, 10, "cs-mid", n2)],
            },
            {
                ns1: [make_pod("t4-p5", 150, 10, "cs-high")],
                ns2: [make_pod("t4-p6", 150, 10, "cs-high")],
            },
        )
        assert "quota t4-ns1/eq-ns1: 150 of max 200 memory used, pod asks 150" in await refused(
            api, ns1, "t4-p5"
        )
        assert (
            "quota t4-ns2/eq-ns2: all quotas use 200 of the 200 memory their mins sum to, "
            "pod asks 150"
        ) in await refused(api, ns2, "t4-p6")
        await still_there(api, ns1, ["t4-p1", "t4-p2", "t4-p3"])
        await still_there(api, ns2, ["t4-p4"])


async def test_a_quota_over_its_min_cannot_grow_past_the_sum_of_mins(
    sched: LatticeProcess, api: client.ApiClient
) -> None:
    """upstream's "pod subjects to overused quota can't preempt pods subjects to other
    quotas" and "cross-node preemption isn't supported": the added pods wait, nothing is
    evicted."""
    async with namespaces(api, "t5-ns1", "t5-ns2") as (ns1, ns2):
        n1, n2 = NODES
        await run_case(
            api,
            {ns1: UPSTREAM_QUOTA, ns2: UPSTREAM_QUOTA},
            {
                ns1: [make_pod("t5-p1", 50, 10, "cs-mid", n1)],
                ns2: [
                    make_pod("t5-p2", 50, 10, "cs-high", n1),
                    make_pod("t5-p3", 50, 10, "cs-high", n2),
                    make_pod("t5-p4", 50, 10, "cs-high", n2),
                ],
            },
            {ns2: [make_pod("t5-p5", 50, 10, "cs-high")]},
        )
        message = await refused(api, ns2, "t5-p5")
        assert "all quotas use 200 of the 200 memory their mins sum to, pod asks 50" in message
        await still_there(api, ns1, ["t5-p1"])
        await still_there(api, ns2, ["t5-p2", "t5-p3", "t5-p4"])
    async with namespaces(api, "t6-ns1", "t6-ns2") as (ns1, ns2):
        n1, n2 = NODES
        await run_case(
            api,
            {ns1: UPSTREAM_QUOTA, ns2: UPSTREAM_QUOTA},
            {
                ns1: [
                    make_pod("t6-p1", 50, 10, "cs-low", n1),
                    make_pod("t6-p2", 50, 10, "cs-low", n2),
                ],
                ns2: [
                    make_pod("t6-p3", 50, 10, "cs-mid", n1),
                    make_pod("t6-p4", 50, 10, "cs-mid", n2),
                ],
            },
            {
                ns1: [make_pod("t6-p5", 100, 20, "cs-high")],
                ns2: [make_pod("t6-p6", 100, 20, "cs-high")],
            },
        )
        for ns, name in ((ns1, "t6-p5"), (ns2, "t6-p6")):
            assert "their mins sum to" in await refused(api, ns, name)
        await still_there(api, ns1, ["t6-p1", "t6-p2"])
        await still_there(api, ns2, ["t6-p3", "t6-p4"])


async def test_borrowing_kube_scheduler_pods_and_status_used(
    sched: LatticeProcess,
    plane: Plane,
    api: client.ApiClient,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A quota borrows the unused min of another up to the sum of mins; pods bound by
    kube-scheduler in a quota namespace count as used; status.used shows the use; `lattice
    explain` shows the quota view."""
    async with namespaces(api, "b-ns1", "b-ns2") as (ns1, ns2):
        await create_quota(
            api, ns1, "eq1", {"min": {"memory": "50", "cpu": "1"}, "max": {"memory": "300"}}
        )
        await create_quota(
            api, ns2, "eq2", {"min": {"memory": "150", "cpu": "1"}, "max": {"memory": "300"}}
        )
        # kube-scheduler's pod in ns1 (its own schedulerName): 50 bytes of ns1's use.
        await create(api, ns1, make_pod("kube", 50, 10, "cs-mid", scheduler="default-scheduler"))
        await bound(api, ns1, "kube")
        await asyncio.sleep(1.0)
        # ns1 borrows ns2's idle min: 50 + 100 = 150, past its own min of 50, within the
        # 200 the mins sum to.
        await create(api, ns1, make_pod("borrow", 100, 10, "cs-mid"))
        await bound(api, ns1, "borrow")
        # 60 more would take all quotas past the sum of mins, though ns1's max has room.
        await create(api, ns1, make_pod("more", 60, 10, "cs-mid"))
        message = await refused(api, ns1, "more")
        assert (
            "quota b-ns1/eq1: all quotas use 150 of the 200 memory their mins sum to, pod asks 60"
        ) in message
        # `lattice explain` shows the same view, rule and totals.
        argv = ["explain", "--kubeconfig", str(plane.cluster.kubeconfig), f"{ns1}/more"]
        assert await asyncio.to_thread(main, [*argv, "-o", "json"]) == 0
        view = json.loads(capsys.readouterr().out)["quota"]
        assert (view["name"], view["rule"], view["admitted"]) == ("eq1", "min", False)
        assert (view["allQuotasUsed"]["memory"], view["sumOfMins"]["memory"]) == ("150", "200")
        custom = client.CustomObjectsApi(api)

        async def used() -> dict[str, Any] | None:
            eq = await custom.get_namespaced_custom_object(EQ[0], EQ[1], ns1, EQ[2], "eq1")
            got = (eq.get("status") or {}).get("used")
            return got if got == {"cpu": "20m", "memory": "150"} else None

        assert await poll(used, within=20, interval=0.3) == {"cpu": "20m", "memory": "150"}
        table = plane.run("get", "elasticquota", "-n", ns1)
        header, row = table.splitlines()[:2]
        assert header.split()[:4] == ["NAME", "MIN", "MAX", "USED"]
        assert row.split()[0] == "eq1"
        assert '"memory":"150"' in row


async def test_usage_is_rebuilt_after_a_restart(
    sched: LatticeProcess, api: client.ApiClient
) -> None:
    """Nothing is persisted: a restarted Lattice counts the bound pods again, and refuses
    what the quota no longer has room for."""
    async with namespaces(api, "r-ns1") as (ns,):
        quota = {"min": {"memory": "100", "cpu": "1"}, "max": {"memory": "100", "cpu": "1"}}
        await create_quota(api, ns, "eq", quota)
        await create(api, ns, make_pod("first", 60, 10, "cs-mid"))
        await bound(api, ns, "first")
        sched.stop()
        sched.start()
        await create(api, ns, make_pod("second", 60, 10, "cs-mid"))
        message = await refused(api, ns, "second", within=60)
        assert "quota r-ns1/eq: 60 of max 100 memory used, pod asks 60" in message


GPU = "nvidia.com/gpu"
GPU_MARK = "lattice.test/quota-gpu"
FAST_LEASE = ("--lease-duration", "6", "--renew-deadline", "4", "--retry-period", "1")
"""Short lease settings: the standby takes over a few seconds after the leader dies."""


def gpu_pod(name: str, gpus: int) -> dict[str, Any]:
    """A pod asking whole GPUs, kept on this test's GPU nodes."""
    body = make_pod(name, 1 << 20, 100, "cs-mid")
    body["spec"]["nodeSelector"] = {GPU_MARK: "yes"}
    requests = body["spec"]["containers"][0]["resources"]["requests"]
    requests[GPU] = str(gpus)
    body["spec"]["containers"][0]["resources"]["limits"] = {GPU: str(gpus)}
    return body


async def events_by_pod(
    api: client.ApiClient, ns: str, reason: str
) -> dict[str, list[tuple[str, str]]]:
    """Each pod's events of one reason, as (reportingInstance, message)."""
    got = await client.CoreV1Api(api).list_namespaced_event(ns, field_selector=f"reason={reason}")
    out: dict[str, list[tuple[str, str]]] = {}
    for e in got.items:
        out.setdefault(e.involved_object.name, []).append(
            (e.reporting_instance or "", e.message or "")
        )
    return out


async def test_failover_keeps_the_accounting_and_the_max(
    sched: LatticeProcess, plane: Plane, api: client.ApiClient
) -> None:
    """Two replicas under leader election: the leader fills a quota near its max and is
    SIGKILLed; the standby takes over with the usage rebuilt from the bound pods, admits
    exactly up to max, refuses the rest naming the rule, and writes status.used. Neither
    replica ever binds past max (every binding and refusal is read from the objects and
    the reporting replica from the events)."""
    sched.stop()  # the module's replica would hold the lease: this test runs its own two
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    nodes = []
    for i in range(2):
        body = get_profile("gpu-8x").node_body(f"gpu-quota-{i}", i)
        body["metadata"]["labels"][GPU_MARK] = "yes"
        nodes.append(body)
    await create_nodes(api, nodes)
    replicas = [plane.lattice(*FAST_LEASE, identity=f"eq-ha-{x}") for x in "ab"]
    coord = client.CoordinationV1Api(api)

    async def holder() -> str | None:
        try:
            lease = await coord.read_namespaced_lease("lattice-scheduler", "lattice-system")
        except client.ApiException:
            return None
        return lease.spec.holder_identity or None

    async def used(ns: str, want: str) -> str | None:
        eq = await custom.get_namespaced_custom_object(EQ[0], EQ[1], ns, EQ[2], "q")
        got = ((eq.get("status") or {}).get("used") or {}).get(GPU)
        return got if got == want else None

    try:
        async with namespaces(api, "ha-a", "ha-b") as (ns, lender):
            # 16 GPUs on the nodes. ha-a may borrow ha-b's idle min up to its own max of
            # 10: with the sum of mins at 16 and nodes half empty, only max binds.
            await create_quota(api, ns, "q", {"min": {GPU: "4"}, "max": {GPU: "10"}})
            await create_quota(api, lender, "q", {"min": {GPU: "12"}, "max": {GPU: "12"}})
            for r in replicas:
                r.start()
            leader = await poll(holder, within=60, interval=0.2)
            victim, survivor = replicas if leader == replicas[0].identity else replicas[::-1]
            await create(api, ns, *(gpu_pod(f"before-{i}", 2) for i in range(3)))
            for i in range(3):
                await bound(api, ns, f"before-{i}")
            assert await poll(lambda: used(ns, "6"), within=30, interval=0.3) == "6"
            # Reports trail bindings and a SIGKILL loses the unsent ones: kill once sent.
            await poll(
                lambda: _count(events_by_pod(api, ns, "Scheduled"), 3), within=30, interval=0.3
            )
            victim.signal(signal.SIGKILL)
            victim.wait(10)
            # Submitted while nobody leads: 8 GPUs asked, 4 left under max.
            await create(api, ns, *(gpu_pod(f"after-{i}", 2) for i in range(4)))
            await poll(lambda: _is(holder(), survivor.identity), within=30, interval=0.2)
            victim.start()  # back as a standby: two replicas again, one leading
            refusals = [await refused_or_bound(api, ns, f"after-{i}") for i in range(4)]
            assert sorted(r is None for r in refusals) == [False, False, True, True], refusals
            for message in filter(None, refusals):
                assert f"quota {ns}/q: 10 of max 10 {GPU} used, pod asks 2" in message
            assert await poll(lambda: used(ns, "10"), within=30, interval=0.3) == "10"
            # One more, with both replicas running: still refused.
            await create(api, ns, gpu_pod("late", 1))
            assert f"quota {ns}/q: 10 of max 10 {GPU} used, pod asks 1" in await refused(
                api, ns, "late"
            )
            pods = (await core.list_namespaced_pod(ns)).items
            placed = [p for p in pods if p.spec.node_name]
            gpus = sum(int(p.spec.containers[0].resources.requests[GPU]) for p in placed)
            assert gpus == 10, "bound past max" if gpus > 10 else "admitted less than max"
            assert not [p for p in pods if p.metadata.deletion_timestamp], "nothing evicted"
            scheduled = await poll(
                lambda: _count(events_by_pod(api, ns, "Scheduled"), 5), within=30, interval=0.3
            )
            assert all(len(v) == 1 for v in scheduled.values()), "a pod was bound twice"
            by = {name: v[0][0] for name, v in scheduled.items()}
            assert {by[f"before-{i}"] for i in range(3)} == {victim.identity}
            assert {by[n] for n in by if n.startswith("after-")} == {survivor.identity}
            failed = await events_by_pod(api, ns, "FailedScheduling")
            assert {i for v in failed.values() for i, _ in v} == {survivor.identity}
            assert all(
                f"quota {ns}/q: 10 of max 10 {GPU} used" in m for v in failed.values() for _, m in v
            )
    finally:
        for r in replicas:
            r.stop()
        for n in nodes:
            await core.delete_node(n["metadata"]["name"])
        sched.start()


async def _count(
    events: Awaitable[dict[str, list[tuple[str, str]]]], at_least: int
) -> dict[str, list[tuple[str, str]]] | None:
    got = await events
    return got if len(got) >= at_least else None


async def _is(value: Awaitable[str | None], want: str) -> bool | None:
    return True if await value == want else None


async def refused_or_bound(api: client.ApiClient, ns: str, name: str) -> str | None:
    """The refusal's message, or None once the pod is bound (whichever settles first)."""

    async def probe() -> tuple[str | None] | None:
        pod = await read_pod(api, ns, name)
        if pod["spec"].get("nodeName"):
            return (None,)
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return (str(cond.get("message", "")),)
        return None

    return (await poll(probe, within=60, interval=0.2))[0]

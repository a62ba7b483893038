"""Gangs end to end: PodGroups placed all-or-nothing by `lattice run` on a real control plane.

Four small kwok nodes (4 CPU each) with our CRDs (scheduler-plugins' PodGroup among them)
and the shipped RBAC bound to a token user, so the scheduler runs with exactly the rights
we ship. Each test creates its PodGroups and pods in a namespace of its own.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any, cast

import pytest
from kubernetes_asyncio import client

from lattice_dev.devcluster.cluster import ClusterConfig
from lattice_dev.devcluster.kube import create_nodes, node_is_ready, poll
from lattice_dev.devcluster.profiles import get_profile
from tests.e2e.lattice_proc import LatticeProcess
from tests.e2e.test_scheduler import Plane, create_pods, lattice_plane, list_pods

NODES = 4
GROUP = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")
LABEL = "scheduling.x-k8s.io/pod-group"

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    config = ClusterConfig(nodes=NODES, node_profile="small")
    with lattice_plane(tmp_path_factory.mktemp("gangplane"), config) as p:
        yield p


@pytest.fixture(scope="module")
def sched(plane: Plane) -> Iterator[LatticeProcess]:
    proc = plane.lattice(identity="gangs").start()
    yield proc
    proc.stop()


def member(name: str, group: str, cpu: str = "500m", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {LABEL: group, "app": group}},
        "spec": {
            "schedulerName": "lattice",
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}},
                }
            ],
            **spec,
        },
    }


async def create_group(api: client.ApiClient, ns: str, name: str, min_member: int) -> None:
    body = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"minMember": min_member},
    }
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        *GROUP[:2], ns, GROUP[2], body
    )


def explain(plane: Plane, *args: str) -> str:
    """`lattice explain` as a user runs it, with the admin kubeconfig."""
    cmd = [sys.executable, "-m", "scheduler.cli", "explain", "--kubeconfig"]
    cmd += [str(plane.cluster.kubeconfig), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120).stdout


async def bound_names(api: client.ApiClient, ns: str) -> set[str]:
    return {p["metadata"]["name"] for p in await list_pods(api, ns) if p["spec"].get("nodeName")}


async def wait_names_bound(api: client.ApiClient, ns: str, names: set[str], within: float) -> None:
    async def done() -> bool:
        return names <= await bound_names(api, ns)

    await poll(done, within=within, interval=0.3)


async def events_of(api: client.ApiClient, ns: str, reason: str) -> list[Any]:
    found = await client.CoreV1Api(api).list_namespaced_event(ns, field_selector=f"reason={reason}")
    return list(found.items)


async def group_status(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = await client.CustomObjectsApi(api).get_namespaced_custom_object(
        *GROUP[:2], ns, GROUP[2], name
    )
    status: dict[str, Any] = obj.get("status") or {}
    return status


async def test_quorum_binds_nothing_until_min_member_are_present(
    api: client.ApiClient, ns: str, sched: LatticeProcess
) -> None:
    await create_group(api, ns, "q", 4)
    await create_pods(api, ns, [member(f"q-{i}", "q") for i in range(3)])

    async def waiting_events() -> list[Any] | None:
        evs = [e for e in await events_of(api, ns, "FailedScheduling") if "quorum" in e.message]
        return evs if len(evs) >= 3 else None

    evs = await poll(waiting_events, within=30, interval=0.3)
    # Each member is told once, with the count when it arrived.
    pattern = re.compile(rf"gang {ns}/q: waiting for quorum: [123]/4 members present")
    assert all(pattern.fullmatch(e.message) for e in evs), [e.message for e in evs]
    assert await bound_names(api, ns) == set()
    await create_pods(api, ns, [member("q-3", "q")])
    await wait_names_bound(api, ns, {f"q-{i}" for i in range(4)}, within=60)

    async def phase() -> str | None:
        status = await group_status(api, ns, "q")
        return status.get("phase") if status.get("phase") in ("Scheduled", "Running") else None

    await poll(phase, within=30, interval=0.5)
    status = await group_status(api, ns, "q")
    assert status["scheduled"] == 4
    assert status.get("scheduleStartTime")


async def test_all_or_nothing_then_a_new_node_admits_the_whole_gang(
    plane: Plane, api: client.ApiClient, ns: str, sched: LatticeProcess
) -> None:
    # One member per node (3 CPU of 4), five members, four nodes: nothing may bind.
    await create_group(api, ns, "big", 5)
    await create_pods(api, ns, [member(f"big-{i}", "big", cpu="3") for i in range(5)])

    async def rejected() -> list[Any] | None:
        evs = [
            e
            for e in await events_of(api, ns, "FailedScheduling")
            if e.message.startswith(f"gang {ns}/big:") and "quorum" not in e.message
        ]
        return evs if len(evs) >= 5 else None

    evs = await poll(rejected, within=60, interval=0.5)
    fit = re.compile(rf"gang {ns}/big: [0-4]/5 members fit: ")
    assert all(fit.match(e.message) for e in evs), evs[0].message
    await asyncio.sleep(3)
    assert await bound_names(api, ns) == set(), "a member of an unadmitted gang was bound"
    core = client.CoreV1Api(api)
    pod = await core.read_namespaced_pod("big-0", ns)
    cond = [c for c in pod.status.conditions or [] if c.type == "PodScheduled"]
    assert cond
    assert cond[0].status == "False"

    body = get_profile("small").node_body("kwok-gang-extra-0", 0)
    await create_nodes(api, [body])
    try:
        await wait_names_bound(api, ns, {f"big-{i}" for i in range(5)}, within=60)
        nodes = {p["spec"]["nodeName"] for p in await list_pods(api, ns)}
        assert len(nodes) == 5, "capacity: one 3-CPU member per 4-CPU node"
    finally:
        for p in await list_pods(api, ns):
            await core.delete_namespaced_pod(p["metadata"]["name"], ns, grace_period_seconds=0)
        await core.delete_node("kwok-gang-extra-0")


async def test_a_gang_that_never_fits_blocks_no_small_pod(
    plane: Plane, api: client.ApiClient, ns: str, sched: LatticeProcess
) -> None:
    await create_group(api, ns, "huge", 3)
    await create_pods(api, ns, [member(f"huge-{i}", "huge", cpu="5") for i in range(3)])
    small = [
        {
            **member(f"small-{i}", "none", cpu="10m"),
            "metadata": {"name": f"small-{i}", "labels": {"app": "small"}},
        }
        for i in range(200)
    ]
    await create_pods(api, ns, small)
    await wait_names_bound(api, ns, {f"small-{i}" for i in range(200)}, within=120)
    bound = await bound_names(api, ns)
    assert not {f"huge-{i}" for i in range(3)} & bound
    evs = [
        e
        for e in await events_of(api, ns, "FailedScheduling")
        if e.involved_object.name.startswith("huge-")
    ]
    assert evs
    assert all(f"gang {ns}/huge" in e.message for e in evs)
    assert any("Insufficient cpu" in e.message for e in evs), evs[0].message

    # `lattice explain` says why there is no plan, per member, and so does a member's own.
    for target in (["--gang", f"{ns}/huge"], [f"{ns}/huge-0"]):
        out = await asyncio.to_thread(explain, plane, *target, "-o", "json")
        gang = json.loads(out)["gang"]
        assert gang["status"] == "infeasible"
        assert gang["admitted"] is False
        assert len(gang["members"]) == 3
        assert all(m["feasibleNodes"] == 0 for m in gang["members"])
        assert all("NodeResourcesFit" in m["rejectingPlugins"] for m in gang["members"])
    table = await asyncio.to_thread(explain, plane, "--gang", f"{ns}/huge")
    assert f"gang {ns}/huge: minMember 3, placed 0, pending 3, need 3" in table
    assert "solver: infeasible" in table


async def test_a_spread_gang_commits_the_plan_only_an_interleaved_order_allows(
    plane: Plane, api: client.ApiClient, ns: str, sched: LatticeProcess
) -> None:
    """Two tainted nodes of our own, zones a (2 CPU) and b (4 CPU); four members spread
    over zones with maxSkew 1: two of 1 CPU, then two of 2. The only valid plan is both
    small ones on a, both large ones on b. Re-checked in member order, the second small
    member failed on a (skew 2) and moved to b, leaving no room for the second large one:
    the gang retried the same plan forever. It must bind as planned."""
    key, taint = "lattice.test/spread-zone", "lattice.test/spread"
    names = {"a": f"kwok-spread-a-{ns}"[:63], "b": f"kwok-spread-b-{ns}"[:63]}
    bodies = []
    for zone, cpu in (("a", "2"), ("b", "4")):
        body = get_profile("small").node_body(names[zone], 0)
        body["metadata"]["labels"][key] = zone
        body["status"]["capacity"]["cpu"] = body["status"]["allocatable"]["cpu"] = cpu
        body["spec"]["taints"] = [{"key": taint, "value": "x", "effect": "NoSchedule"}]
        bodies.append(body)
    core = client.CoreV1Api(api)
    await create_nodes(api, bodies)
    try:
        await create_group(api, ns, "spread", 4)
        spread = {
            "maxSkew": 1,
            "topologyKey": key,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "spread"}},
        }
        toleration = {"key": taint, "operator": "Exists", "effect": "NoSchedule"}
        exists = {"matchExpressions": [{"key": key, "operator": "Exists"}]}
        ours = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [exists]}
            }
        }
        for name, cpu in (("y0", "1"), ("y1", "1"), ("x0", "2"), ("x1", "2")):
            body = member(
                name,
                "spread",
                cpu=cpu,
                topologySpreadConstraints=[spread],
                tolerations=[toleration],
                affinity=ours,
            )
            await create_pods(api, ns, [body])  # one by one: the members' order is the bug's
        await wait_names_bound(api, ns, {"y0", "y1", "x0", "x1"}, within=60)
        where = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in await list_pods(api, ns)}
        assert where == {"y0": names["a"], "y1": names["a"], "x0": names["b"], "x1": names["b"]}
        assert not [
            e for e in await events_of(api, ns, "FailedScheduling") if "no longer fits" in e.message
        ], "a commit of the valid plan failed"
    finally:
        for p in await list_pods(api, ns):
            await core.delete_namespaced_pod(p["metadata"]["name"], ns, grace_period_seconds=0)
        for name in names.values():
            await core.delete_node(name)


@pytest.mark.parametrize("key", ["kubernetes.io/hostname", "topology.kubernetes.io/zone"])
async def test_an_mpijob_launcher_and_workers_with_affinity_to_it_are_placed_whole(
    plane: Plane, api: client.ApiClient, ns: str, sched: LatticeProcess, key: str
) -> None:
    """An MPIJob's shape: 1 launcher, 4 workers with required pod affinity to the
    launcher's labels (on ``key``), the launcher with none, created workers first. No
    placed pod matches the workers' term, and they do not match it themselves, so each
    member alone is rejected everywhere: the gang was reported proven infeasible. Nodes of
    our own: zone a has two of 2 CPU, zone b one of 1 CPU. With the zone key, 5 x 500m
    fit no single node, so the gang must share zone a over both its nodes; with hostname,
    5 x 300m fit one node, where all must go."""
    marker, taint = "lattice.test/mpi", "lattice.test/mpi"
    suffix = ns[-20:]
    nodes = {
        f"kwok-mpi-{zone}{i}-{suffix}"[:63]: (zone, cpu)
        for zone, i, cpu in (("a", 0, "2"), ("a", 1, "2"), ("b", 0, "1"))
    }
    bodies = []
    for name, (zone, cpu) in nodes.items():
        body = get_profile("small").node_body(name, 0)
        body["metadata"]["labels"][marker] = "yes"
        body["metadata"]["labels"]["topology.kubernetes.io/zone"] = f"mpi-{zone}-{suffix}"
        body["status"]["capacity"]["cpu"] = body["status"]["allocatable"]["cpu"] = cpu
        body["spec"]["taints"] = [{"key": taint, "value": "x", "effect": "NoSchedule"}]
        bodies.append(body)
    core = client.CoreV1Api(api)
    await create_nodes(api, bodies)

    async def all_ready() -> bool | None:
        # Until kwok reports them Ready they carry the not-ready taint the members do not
        # tolerate: a gang arriving before that is (rightly) refused, which is not the test.
        got = [await core.read_node(name) for name in nodes]
        return True if all(node_is_ready(n) for n in got) else None

    await poll(all_ready, within=60, interval=0.2)
    cpu = "300m" if key == "kubernetes.io/hostname" else "500m"
    try:
        await create_group(api, ns, "mpi", 5)
        toleration = {"key": taint, "operator": "Exists", "effect": "NoSchedule"}
        ours = {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": marker, "operator": "In", "values": ["yes"]}]}
                ]
            }
        }
        to_launcher = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchLabels": {"training.kubeflow.org/job-role": "launcher"}
                    },
                    "topologyKey": key,
                }
            ]
        }
        names = [f"mpi-worker-{i}" for i in range(4)] + ["mpi-launcher"]
        for name in names:
            role = "launcher" if name == "mpi-launcher" else "worker"
            affinity: dict[str, Any] = {"nodeAffinity": ours}
            if role == "worker":
                affinity["podAffinity"] = to_launcher
            body = member(name, "mpi", cpu=cpu, tolerations=[toleration], affinity=affinity)
            body["metadata"]["labels"]["training.kubeflow.org/job-role"] = role
            await create_pods(api, ns, [body])  # one by one: workers arrive first
        await wait_names_bound(api, ns, set(names), within=60)
        pods = await list_pods(api, ns)
        where = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}
        home = where["mpi-launcher"]
        if key == "kubernetes.io/hostname":
            assert set(where.values()) == {home}, where
        else:
            assert {nodes[n][0] for n in where.values()} == {"a"}, where
            assert len(set(where.values())) == 2, where
        refused = [
            e.message
            for e in await events_of(api, ns, "FailedScheduling")
            if "waiting for quorum" not in e.message
        ]
        assert refused == [], "the gang was refused or its commit failed"
    finally:
        for p in await list_pods(api, ns):
            await core.delete_namespaced_pod(p["metadata"]["name"], ns, grace_period_seconds=0)
        for name in nodes:
            await core.delete_node(name)


KUBEFLOW_PODGROUP = """
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: PodGroup
metadata:
  name: pytorch-dist
  labels:
    training.kubeflow.org/job-name: pytorch-dist
spec:
  minMember: 3
  minResources:
    cpu: "1500m"
    memory: 192Mi
  scheduleTimeoutSeconds: 120
"""


async def test_a_podgroup_as_kubeflow_writes_it_works_unchanged(
    plane: Plane, api: client.ApiClient, ns: str, sched: LatticeProcess
) -> None:
    plane.run("apply", "-n", ns, "-f", "-", stdin=KUBEFLOW_PODGROUP)
    pods = []
    for i, role in enumerate(("master", "worker", "worker")):
        body = member(f"pytorch-dist-{role}-{i}", "pytorch-dist")
        body["metadata"]["labels"].update(
            {
                "training.kubeflow.org/job-name": "pytorch-dist",
                "training.kubeflow.org/replica-type": role,
                "training.kubeflow.org/replica-index": str(i),
            }
        )
        pods.append(body)
    await create_pods(api, ns, pods)
    await wait_names_bound(api, ns, {p["metadata"]["name"] for p in pods}, within=60)

    async def shown() -> str | None:
        out = plane.run("get", "pg", "-n", ns, "pytorch-dist")
        return out if ("Scheduled" in out or "Running" in out) else None

    out = await poll(shown, within=30, interval=0.5)
    header = out.splitlines()[0]
    for column in ("PHASE", "MINMEMBER", "SCHEDULED", "RUNNING", "AGE"):
        assert column in header, out


async def set_spec(api: client.ApiClient, spec: dict[str, Any]) -> None:
    """Merge into the LatticeScheduler object (created by the first `lattice run`)."""
    objects = client.CustomObjectsApi(api)

    async def exists() -> bool:
        try:
            await objects.get_cluster_custom_object(
                "lattice.dev", "v1alpha1", "latticeschedulers", "lattice"
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    await poll(exists, within=60, interval=0.3)
    patch = cast(Any, objects).patch_cluster_custom_object
    await patch(
        "lattice.dev",
        "v1alpha1",
        "latticeschedulers",
        "lattice",
        {"spec": spec},
        _content_type="application/merge-patch+json",
    )


async def test_sigkill_while_a_30_member_gang_binds_then_restart_completes_it(
    plane: Plane, api: client.ApiClient, ns: str, sched: LatticeProcess
) -> None:
    # The module's scheduler is stopped here: this test runs two of its own.
    sched.stop()
    lease = ("--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "1")
    first = plane.lattice(*lease, identity="gang-kill-a").start()
    await set_spec(api, {"clientQPS": 10, "clientBurst": 1})  # slow writes: kill mid-gang
    await asyncio.sleep(2)  # the spec reaches the process through its watch
    second: LatticeProcess | None = None
    try:
        await create_group(api, ns, "train", 30)
        await create_pods(api, ns, [member(f"train-{i}", "train", cpu="100m") for i in range(30)])

        async def some_bound() -> bool:
            return len(await bound_names(api, ns)) >= 3

        await poll(some_bound, within=90, interval=0.1)
        first.signal(signal.SIGKILL)
        first.wait(10)
        partial = len(await bound_names(api, ns))
        assert partial < 30, "the kill came too late to test a partial gang"
        await set_spec(api, {"clientQPS": 500, "clientBurst": 1000})
        second = plane.lattice(*lease, identity="gang-kill-b").start()
        await wait_names_bound(api, ns, {f"train-{i}" for i in range(30)}, within=120)
        events = collections.Counter(
            e.involved_object.name for e in await events_of(api, ns, "Scheduled")
        )
        assert max(events.values()) == 1, "a member was bound twice"
    finally:
        first.stop()
        if second is not None:
            second.stop()
        sched.start()


def test_podgroup_rbac_is_granted_and_no_more(plane: Plane) -> None:
    from lattice_dev.devcluster.cluster import LATTICE_USER

    def can(verb: str, resource: str, *extra: str) -> bool:
        out = plane.run(
            "auth", "can-i", verb, resource, f"--as={LATTICE_USER.name}", "-A", *extra, check=False
        )
        return out.strip() == "yes"

    assert can("watch", "podgroups.scheduling.x-k8s.io")
    assert can("patch", "podgroups.scheduling.x-k8s.io", "--subresource=status")
    assert not can("delete", "podgroups.scheduling.x-k8s.io")
    assert not can("update", "podgroups.scheduling.x-k8s.io")

"""Nominations end to end: a preemptor's nomination, made by `lattice run` itself, holds its
room against a gang and a single pod of lower priority (issue #23, item 7).

One small kwok node (4 cpu). A low-priority victim V (2 cpu, bound directly) carries a
finalizer, so once evicted it stays Terminating and still holds its room, as a pod in its
grace period does. A high-priority pod P asks the whole node: Lattice evicts V and
nominates P to the node, where P waits. Then a gang of V's priority (two members of 500m,
a PodGroup of minMember 2) and a single pod of 1 cpu arrive: together they fit the 2 free
cpu, but only by taking P's room, which kube's filters forbid
(``RunFilterPluginsWithNominatedPods``: nominated pods of equal or higher priority count
on their node). They must wait Unschedulable (PodScheduled, FailedScheduling, the
PodGroup's condition), never SchedulerError, and no attempt may count as
``result="error"``. Once V's finalizer is removed P binds to the node; once P is deleted
the gang is placed whole and the single pod binds.

Then a nomination Lattice did not make (a previous leader's, or any writer's), written to
a pending pod Lattice already holds: it counts too, as kube-scheduler counts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Iterator
from typing import Any, cast

import pytest
from kubernetes_asyncio import client

from lattice_dev.devcluster import pki
from lattice_dev.devcluster.cluster import ClusterConfig
from lattice_dev.devcluster.kube import poll
from scheduler.model.podgroup import SCHEDULED_CONDITION
from tests.e2e.lattice_proc import LatticeProcess
from tests.e2e.test_gang_preemption import body as gang_pod
from tests.e2e.test_preemption import Recorder, raw_list
from tests.e2e.test_scheduler import Plane, _scrape, lattice_plane
from tests.e2e.test_stream_recovery import GATED, metric

GROUP = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")
LABEL = "scheduling.x-k8s.io/pod-group"
CLASSES = {"nom-low": 10, "nom-high": 1000}
FINALIZER = "lattice.test/hold"

pytestmark = pytest.mark.cluster


HOLD_POLICY = f"""
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: nom-hold
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: ["v1"]
      operations: ["UPDATE"]
      resources: ["pods"]
  matchConditions:
  - name: kwok
    expression: "request.userInfo.username == '{pki.KWOK.name}'"
  validations:
  - expression: >-
      !(has(oldObject.metadata.finalizers) && '{FINALIZER}' in oldObject.metadata.finalizers)
      || (has(object.metadata.finalizers) && '{FINALIZER}' in object.metadata.finalizers)
    message: the test holds this pod Terminating
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: nom-hold
spec:
  policyName: nom-hold
  validationActions: [Deny]
"""
"""kwok's pod-delete stage empties a deleted pod's finalizers (a kubelet would not): this
keeps kwok from removing ours, so the victim stays Terminating, on its node, until the
test removes the finalizer itself."""


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    config = ClusterConfig(nodes=1, node_profile="small")  # 4 cpu
    with lattice_plane(tmp_path_factory.mktemp("nomplane"), config) as p:
        p.run("apply", "-f", "-", stdin=HOLD_POLICY)
        yield p


def hold_enforced(plane: Plane, ns: str, name: str) -> bool:
    """Whether kwok's removal of ``name``'s finalizer is refused yet (a server dry run as
    kwok: the policy takes effect a moment after it is created)."""
    out = subprocess.run(
        [
            plane.kubectl,
            f"--kubeconfig={plane.cluster.kubeconfig}",
            f"--as={pki.KWOK.name}",
            "--as-group=system:masters",
            "-n",
            ns,
            "patch",
            "pod",
            name,
            "--type=merge",
            "-p",
            '{"metadata":{"finalizers":null}}',
            "--dry-run=server",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if out.returncode == 0:
        return False
    assert "holds this pod Terminating" in out.stderr, out.stderr
    return True


def body(
    name: str,
    cpu: str,
    klass: str,
    *,
    node: str | None = None,
    group: str | None = None,
    finalizer: bool = False,
) -> dict[str, Any]:
    """The gang preemption test's pod, optionally held Terminating by our finalizer."""
    out = gang_pod(name, cpu, klass, node=node, group=group)
    if finalizer:
        out["metadata"]["finalizers"] = [FINALIZER]
    return out


def pod_scheduled(pod: dict[str, Any]) -> dict[str, Any] | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled":
            return cast(dict[str, Any], condition)
    return None


ATTEMPTS = ("scheduler_schedule_attempts_total", "lattice_scheduling_attempts_total")
"""kube-scheduler's attempt series (one per pod) and Lattice's own (one per cycle)."""


async def attempts(sched: LatticeProcess) -> dict[tuple[str, str], float]:
    """Each series of :data:`ATTEMPTS` by (name, result), from one /metrics scrape."""
    out: dict[tuple[str, str], float] = {}
    for row in (await _scrape(sched, "/metrics")).splitlines():
        name, _, rest = row.partition("{")
        if name not in ATTEMPTS:
            continue
        result = rest.split('result="', 1)[1].split('"', 1)[0]
        out[(name, result)] = out.get((name, result), 0.0) + float(row.rpartition(" ")[2])
    return out


async def error_attempts(sched: LatticeProcess) -> float:
    """Attempts counted as ``result="error"`` (the kube series is precreated at 0, so a
    scrape that does not show it is a broken check, not a pass)."""
    seen = await attempts(sched)
    assert (ATTEMPTS[0], "error") in seen, sorted(seen)
    return sum(v for (_, result), v in seen.items() if result == "error")


async def cycles(sched: LatticeProcess) -> float:
    """Lattice's cycles so far, any result."""
    return sum(v for (name, _), v in (await attempts(sched)).items() if name == ATTEMPTS[1])


async def create_classes(api: client.ApiClient) -> None:
    scheduling = client.SchedulingV1Api(api)
    for name, value in CLASSES.items():
        pc: dict[str, Any] = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass"}
        pc |= {"metadata": {"name": name}, "value": value}
        with contextlib.suppress(client.ApiException):
            await scheduling.create_priority_class(cast(client.V1PriorityClass, pc))


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


async def wait_settled(api: client.ApiClient, ns: str, names: set[str]) -> None:
    """Until each of ``names`` has a PodScheduled condition of an attempt (a gang's
    members wait for their quorum first)."""
    core = client.CoreV1Api(api)

    async def settled() -> bool:
        pods = await raw_list(core.list_namespaced_pod, ns)
        conds = {
            p["metadata"]["name"]: c
            for p in pods
            if p["metadata"]["name"] in names and (c := pod_scheduled(p)) is not None
        }
        if any("quorum" in c.get("message", "") for c in conds.values()):
            return False
        return set(conds) == names

    await poll(settled, within=60, interval=0.3)


async def assert_waiting(api: client.ApiClient, ns: str, names: set[str], gang: str) -> None:
    """Each of ``names`` pending, Unschedulable (PodScheduled, FailedScheduling, the
    PodGroup's condition), never for a plan that "no longer fits" (a solve that ignored a
    nomination its commit then honoured)."""
    core = client.CoreV1Api(api)
    pods = {p["metadata"]["name"]: p for p in await raw_list(core.list_namespaced_pod, ns)}
    assert not [n for n in names if pods[n]["spec"].get("nodeName")], "bound past a nomination"
    for name in names:
        c = pod_scheduled(pods[name])
        assert c is not None, name
        assert (c["status"], c.get("reason")) == ("False", "Unschedulable"), (name, c)
        assert "no longer fits" not in c.get("message", ""), (name, c)
    events = await core.list_namespaced_event(ns, field_selector="reason=FailedScheduling")
    said = [e for e in events.items if e.involved_object.name in names]
    assert {e.involved_object.name for e in said} == names
    assert not [e for e in said if "no longer fits" in e.message], [e.message for e in said]
    obj: dict[str, Any] = await client.CustomObjectsApi(api).get_namespaced_custom_object(
        *GROUP[:2], ns, GROUP[2], gang
    )
    (cond,) = [
        c
        for c in (obj.get("status") or {}).get("conditions") or []
        if c.get("type") == SCHEDULED_CONDITION
    ]
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable"), cond


async def wait_bound(api: client.ApiClient, ns: str, names: set[str]) -> dict[str, str]:
    core = client.CoreV1Api(api)

    async def all_bound() -> dict[str, str] | None:
        pods = await raw_list(core.list_namespaced_pod, ns)
        placed = {
            p["metadata"]["name"]: p["spec"]["nodeName"]
            for p in pods
            if p["metadata"]["name"] in names and p["spec"].get("nodeName")
        }
        return placed if set(placed) == names else None

    return await poll(all_bound, within=60, interval=0.3)


async def test_a_preemptors_nomination_holds_its_room_against_a_lower_gang_and_pod(
    plane: Plane, api: client.ApiClient, ns: str
) -> None:
    core = client.CoreV1Api(api)
    await create_classes(api)
    (node,) = [n["metadata"]["name"] for n in await raw_list(core.list_node)]
    victim = body("victim", "2", "nom-low", node=node, finalizer=True)
    await core.create_namespaced_pod(ns, cast(client.V1Pod, victim))

    async def victim_running() -> bool:
        pod = await core.read_namespaced_pod("victim", ns)
        return pod.status.start_time is not None

    await poll(victim_running, within=60, interval=0.3)

    async def held() -> bool:
        return await asyncio.to_thread(hold_enforced, plane, ns, "victim")

    await poll(held, within=30, interval=0.5)
    recorder = Recorder(api, ns)
    recorder.start()
    sched = plane.lattice(identity="nominations").start()
    waiting = {"gang-0", "gang-1", "single"}
    try:
        await asyncio.sleep(3.0)  # the scheduler syncs its streams

        # 1. P preempts V and is nominated; V stays Terminating (its finalizer), P waits.
        await core.create_namespaced_pod(ns, cast(client.V1Pod, body("pree", "4", "nom-high")))

        async def nominated() -> bool:
            pods = {p["metadata"]["name"]: p for p in await raw_list(core.list_namespaced_pod, ns)}
            status = pods["pree"].get("status") or {}
            return bool(
                pods["victim"]["metadata"].get("deletionTimestamp")
                and status.get("nominatedNodeName") == node
            )

        await poll(nominated, within=60, interval=0.3)
        cond = recorder.disruption_target("victim")
        assert cond is not None
        assert cond.reason == "PreemptionByScheduler"
        pree = await core.read_namespaced_pod("pree", ns)
        assert not pree.spec.node_name, "P bound while its victim still held its room"

        # 2. A gang and a single pod of V's priority: together they fit only in P's room.
        await create_group(api, ns, "gang", 2)
        for b in [body(f"gang-{i}", "500m", "nom-low", group="gang") for i in range(2)]:
            await core.create_namespaced_pod(ns, cast(client.V1Pod, b))
        await core.create_namespaced_pod(ns, cast(client.V1Pod, body("single", "1", "nom-low")))
        await wait_settled(api, ns, waiting)
        assert await cycles(sched) > 0
        await asyncio.sleep(3.0)  # any retry (a backoff) must keep them Unschedulable
        await assert_waiting(api, ns, waiting, "gang")
        pods = {p["metadata"]["name"]: p for p in await raw_list(core.list_namespaced_pod, ns)}
        assert not pods["pree"]["spec"].get("nodeName")
        assert pods["victim"]["metadata"].get("deletionTimestamp")
        assert (pods["pree"].get("status") or {}).get("nominatedNodeName") == node
        assert await error_attempts(sched) == 0
        lines = [ln for ln in sched.lines() if str(ln.get("gang", "")) == f"{ns}/gang"]
        failures = [
            str(ln.get("reason")) for ln in lines if ln.get("event") == "gang_unschedulable"
        ]
        assert failures, "the gang never reported an attempt"
        assert not [r for r in failures if "no longer fits" in r or "internal error" in r]

        # 3. V's room is freed: P binds to its node; the others still do not fit.
        await core.patch_namespaced_pod("victim", ns, {"metadata": {"finalizers": None}})

        async def pree_bound() -> str | None:
            pod = await core.read_namespaced_pod("pree", ns)
            return cast(str | None, pod.spec.node_name)

        assert await poll(pree_bound, within=60, interval=0.3) == node
        await asyncio.sleep(1.0)
        pods = {p["metadata"]["name"]: p for p in await raw_list(core.list_namespaced_pod, ns)}
        assert not [n for n in waiting if pods[n]["spec"].get("nodeName")]

        # 4. P leaves: the gang is placed whole, and the single pod binds.
        await core.delete_namespaced_pod("pree", ns, grace_period_seconds=0)

        placed = await wait_bound(api, ns, waiting)
        assert set(placed.values()) == {node}
        assert await error_attempts(sched) == 0
    finally:
        sched.stop()
        await recorder.stop()
        with contextlib.suppress(client.ApiException):
            await core.patch_namespaced_pod("victim", ns, {"metadata": {"finalizers": None}})


async def test_a_nomination_another_writer_sets_on_a_pending_pod_counts_as_kubes_does(
    plane: Plane, api: client.ApiClient, ns: str
) -> None:
    """A nomination Lattice did not make: a previous leader's (written while this replica
    stood by) or any writer's, set on a pending pod Lattice already holds. Here the pod is
    gated (so nobody schedules it) and its ``status.nominatedNodeName`` is patched, the
    reverted e2e of f2c827d. kube-scheduler 1.34 counts it: the pod's update reaches
    ``PriorityQueue.Update``, which for a pod in unschedulablePods (gated pods are kept
    there) calls ``UpdateNominatedPod`` whatever its gates (checked against kube-scheduler
    v1.34.4 on this harness: a 2-cpu pod waited Unschedulable beside a gated 3-cpu pod
    nominated to a 4-cpu node). Lattice used to drop that status-only update before parsing
    it (its fingerprint left ``nominatedNodeName`` out), so the room was given away."""
    core = client.CoreV1Api(api)
    await create_classes(api)
    (node,) = [n["metadata"]["name"] for n in await raw_list(core.list_node)]
    sched = plane.lattice(identity="foreign-nomination").start()
    waiting = {"fg-0", "fg-1", "alone"}
    try:
        await asyncio.sleep(3.0)  # the scheduler syncs its streams
        holder = body("holder", "3", "nom-high")
        holder["spec"]["schedulingGates"] = [{"name": "lattice.test/hold"}]
        await core.create_namespaced_pod(ns, cast(client.V1Pod, holder))

        async def held() -> bool:
            return await metric(sched, GATED) == 1

        await poll(held, within=30, interval=0.3)  # Lattice holds it, not nominated
        await core.patch_namespaced_pod_status(
            "holder", ns, {"status": {"nominatedNodeName": node}}
        )
        await asyncio.sleep(1.0)
        # 1.5 cpu each: either fits the node only in the holder's room (1 cpu is free).
        await create_group(api, ns, "fg", 2)
        for b in [body(f"fg-{i}", "750m", "nom-low", group="fg") for i in range(2)]:
            await core.create_namespaced_pod(ns, cast(client.V1Pod, b))
        await core.create_namespaced_pod(ns, cast(client.V1Pod, body("alone", "1500m", "nom-low")))
        await wait_settled(api, ns, waiting)
        await asyncio.sleep(2.0)
        await assert_waiting(api, ns, waiting, "fg")
        assert await error_attempts(sched) == 0

        await core.delete_namespaced_pod("holder", ns, grace_period_seconds=0)
        placed = await wait_bound(api, ns, waiting)
        assert set(placed.values()) == {node}
        assert await error_attempts(sched) == 0
    finally:
        sched.stop()

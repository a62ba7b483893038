"""Volumes in the scheduler process, without a server: a fake writer records the PreBind
patches. A pod with a WaitForFirstConsumer claim is decided with the storage the watch
delivered, its PV or claim is written (conditional on the version read), the binding waits
until the PV controller's bind shows up, and a failed write or a reset claim gives the
PV back and retries the pod with backoff."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from scheduler.control.gangs import entry_key
from scheduler.control.kubeio import KubeWriter
from scheduler.control.queue import QueueName, pod_key
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import parse_spec
from scheduler.control.storage import Kind
from scheduler.core.volumes import GANG_CLAIMS_ADVICE, VolumePatch
from scheduler.model.volume import BIND_COMPLETED, SELECTED_NODE
from scheduler.obs.metrics import Metrics
from tests.builders import make_node, make_pod
from tests.control.test_gangs import FakeWriter, member, podgroup, run_one
from tests.e2e.differential.volumes_objects import (
    HOSTNAME,
    claim_volume,
    csi_driver,
    pv,
    pvc,
    storage_capacity,
    storage_class,
)

_rv = iter(range(100, 10_000_000))


class VolumeWriter(FakeWriter):
    def __init__(self) -> None:
        super().__init__()
        self.volume_patches: list[VolumePatch] = []
        self.refuse: str | None = None
        """Answer every volume patch with this failure."""

    async def patch_volume(self, patch: VolumePatch) -> str | None:
        self.volume_patches.append(patch)
        return self.refuse


_made: list[Scheduler] = []


@pytest.fixture(autouse=True)
async def stopped(no_leaked_tasks: None) -> AsyncIterator[None]:
    """Every scheduler a test made is shut down after it: a PreBind wait left running
    would outlive the test (it waits up to 10 minutes for the PV controller)."""
    yield
    while _made:
        await _made.pop().shutdown(1.0)


def setup(nodes: int = 3) -> tuple[Scheduler, VolumeWriter]:
    writer = VolumeWriter()
    sched = Scheduler(
        parse_spec({}, "lattice"), writer=cast(KubeWriter, writer), metrics=Metrics.create()
    )
    _made.append(sched)
    for i in range(nodes):
        sched.node_upserted(make_node(f"n{i}", cpu="4", memory="16Gi").obj())
    return sched, writer


def versioned(body: dict[str, Any], uid: str | None = None) -> dict[str, Any]:
    body["metadata"]["resourceVersion"] = str(next(_rv))
    if uid is not None:
        body["metadata"]["uid"] = uid
    return body


def claimant(name: str, *claims: str) -> dict[str, Any]:
    body = make_pod(name, "1").obj()
    body["spec"]["schedulerName"] = "lattice"
    body["spec"]["volumes"] = [claim_volume(f"v{i}", c) for i, c in enumerate(claims)]
    body["metadata"]["resourceVersion"] = str(next(_rv))
    body["status"] = {"phase": "Pending"}
    return body


def cycle(sched: Scheduler, name: str) -> None:
    info = sched.queue.try_pop()
    assert info is not None, sched.queue.counts()
    assert info.pod.name == name
    sched.schedule_one(info)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def local_storage(sched: Scheduler, *pvs: tuple[str, str]) -> None:
    sched.storage_upserted(Kind.CLASS, versioned(storage_class("local")))
    for name, host in pvs:
        sched.storage_upserted(Kind.PV, versioned(pv(name, host=host)))


def pv_controller_binds(sched: Scheduler, claim: str, uid: str, volume: str, host: str) -> None:
    """What kube-controller-manager does after our claimRef: the PV and the claim bound."""
    bound_pv = pv(volume, host=host, claim=("default", claim), phase="Bound")
    bound_pv["spec"]["claimRef"]["uid"] = uid
    sched.storage_upserted(Kind.PV, versioned(bound_pv))
    sched.storage_upserted(Kind.PVC, versioned(pvc(claim, volume_name=volume, bound=True), uid=uid))


def conditions(writer: FakeWriter, name: str) -> list[tuple[str, str]]:
    return [(reason, message) for pod, reason, message, _ in writer.conditions if pod == name]


async def test_a_claim_binds_its_only_matching_local_pv_before_the_pod() -> None:
    sched, writer = setup()
    local_storage(sched, ("pv-a", "n2"))
    sched.storage_upserted(Kind.PVC, versioned(pvc("data"), uid="claim-1"))
    sched.pod_upserted(claimant("p", "data"))
    cycle(sched, "p")
    await settle()

    (patch,) = writer.volume_patches
    assert (patch.kind, patch.namespace, patch.name) == ("PersistentVolume", "", "pv-a")
    read = sched.cache.volumes.pvs["pv-a"]
    assert read.claim_ref is not None  # assumed
    assert read.claim_ref.uid == "claim-1"
    ref = patch.body["spec"]["claimRef"]
    assert (ref["namespace"], ref["name"], ref["uid"]) == ("default", "data", "claim-1")
    assert patch.body["metadata"]["resourceVersion"]  # conditional on the PV read
    assert writer.binds == []  # kube's PreBind waits for the PV controller

    pv_controller_binds(sched, "data", "claim-1", "pv-a", "n2")
    await settle()
    assert writer.binds == [("p", "n2")]
    assert sched.counters.scheduled == 1


async def test_an_assumed_pv_is_not_offered_to_the_next_claim() -> None:
    sched, writer = setup()
    local_storage(sched, ("pv-a", "n2"))
    sched.storage_upserted(Kind.PVC, versioned(pvc("one"), uid="claim-1"))
    sched.storage_upserted(Kind.PVC, versioned(pvc("two"), uid="claim-2"))
    sched.pod_upserted(claimant("first", "one"))
    sched.pod_upserted(claimant("second", "two"))
    cycle(sched, "first")
    cycle(sched, "second")
    await settle()
    assert [p.name for p in writer.volume_patches] == ["pv-a"]
    ((reason, message),) = conditions(writer, "second")
    assert reason == "Unschedulable"
    assert "didn't find available persistent volumes to bind" in message


async def test_a_provisioned_claim_gets_the_selected_node_and_a_reset_retries_the_pod() -> None:
    sched, writer = setup()
    sched.storage_upserted(
        Kind.CLASS, versioned(storage_class("fast", provisioner="example.com/fast"))
    )
    sched.storage_upserted(Kind.PVC, versioned(pvc("data", storage_class="fast"), uid="claim-1"))
    sched.pod_upserted(claimant("p", "data"))
    cycle(sched, "p")
    await settle()

    (patch,) = writer.volume_patches
    assert (patch.kind, patch.name) == ("PersistentVolumeClaim", "data")
    node = patch.body["metadata"]["annotations"][SELECTED_NODE]
    assert node in {"n0", "n1", "n2"}
    assert sched.cache.volumes.pvcs[("default", "data")].selected_node == node  # assumed

    # The provisioner cannot provision there: it takes the annotation away.
    sched.storage_upserted(Kind.PVC, versioned(pvc("data", storage_class="fast"), uid="claim-1"))
    await settle()
    assert writer.binds == []
    ((reason, message),) = conditions(writer, "p")
    assert reason == "SchedulerError"
    assert message == (
        'running PreBind plugin "VolumeBinding": selectedNode annotation reset for PVC default/data'
    )
    assert sched.queue.counts().get(QueueName.BACKOFF) == 1
    row = sched.cache.snapshot.index_of(node)
    assert row is not None
    assert list(sched.cache.snapshot.pods_on(row)) == []  # the room is given back


async def test_a_refused_write_gives_the_pv_back() -> None:
    sched, writer = setup()
    local_storage(sched, ("pv-a", "n1"))
    sched.storage_upserted(Kind.PVC, versioned(pvc("data"), uid="claim-1"))
    writer.refuse = "updating PersistentVolume pv-a: 409 the object has been modified"
    sched.pod_upserted(claimant("p", "data"))
    cycle(sched, "p")
    await settle()
    assert writer.binds == []
    assert sched.cache.volumes.pvs["pv-a"].claim_ref is None  # the assumption is forgotten
    ((reason, message),) = conditions(writer, "p")
    assert reason == "SchedulerError"
    assert message.endswith("409 the object has been modified")

    writer.refuse = None
    sched.queue.flush(now=float("inf"))
    cycle(sched, "p")
    await settle()
    assert [p.name for p in writer.volume_patches] == ["pv-a", "pv-a"]


async def test_a_missing_claim_waits_until_the_storage_arrives() -> None:
    sched, writer = setup()
    sched.pod_upserted(claimant("p", "data"))
    cycle(sched, "p")
    await settle()
    ((reason, message),) = conditions(writer, "p")
    assert reason == "Unschedulable"
    assert 'persistentvolumeclaim "data" not found' in message
    assert sched.queue.counts().get(QueueName.UNSCHEDULABLE) == 1

    # A plain pod's pods-only event does not wake it; its claim arriving does.
    local_storage(sched, ("pv-a", "n0"))
    sched.storage_upserted(Kind.PVC, versioned(pvc("data"), uid="claim-1"))
    assert sched.queue.counts().get(QueueName.UNSCHEDULABLE, 0) == 0
    sched.queue.flush(now=float("inf"))
    cycle(sched, "p")
    await settle()
    assert [p.name for p in writer.volume_patches] == ["pv-a"]


async def test_a_claim_to_provision_waits_for_a_storage_capacity_with_room() -> None:
    """CSIDrivers and CSIStorageCapacities from the watch (capacities keyed namespace/name):
    no room anywhere leaves the pod unschedulable; room on n2 wakes it and it goes there."""
    sched, writer = setup()
    driver = "csi.example.com"
    sched.storage_upserted(Kind.CLASS, versioned(storage_class("fast", provisioner=driver)))
    sched.storage_upserted(Kind.CSI_DRIVER, versioned(csi_driver(driver, storage_capacity=True)))
    small = storage_capacity("n2-fast", "fast", "1Gi", nodes={HOSTNAME: "n2"})
    sched.storage_upserted(Kind.CAPACITY, versioned(small))
    sched.storage_upserted(Kind.PVC, versioned(pvc("data", storage_class="fast"), uid="claim-1"))
    sched.pod_upserted(claimant("p", "data"))
    cycle(sched, "p")
    await settle()
    ((reason, message),) = conditions(writer, "p")
    assert reason == "Unschedulable"
    assert "3 node(s) did not have enough free storage" in message
    assert sched.storage.keys(Kind.CAPACITY) == {"kube-system/n2-fast"}

    roomy = storage_capacity("n2-fast", "fast", "100Gi", nodes={HOSTNAME: "n2"})
    sched.storage_upserted(Kind.CAPACITY, versioned(roomy))
    assert sched.queue.counts().get(QueueName.UNSCHEDULABLE, 0) == 0
    sched.queue.flush(now=float("inf"))
    cycle(sched, "p")
    await settle()
    (patch,) = writer.volume_patches
    assert patch.body["metadata"]["annotations"][SELECTED_NODE] == "n2"
    sched.storage_deleted(Kind.CAPACITY, roomy)
    sched.storage_deleted(Kind.CSI_DRIVER, csi_driver(driver))
    assert not sched.cache.volumes.capacities
    assert not sched.cache.volumes.csi_drivers


async def test_a_claim_deleted_while_waiting_fails_the_prebind() -> None:
    sched, writer = setup()
    local_storage(sched, ("pv-a", "n0"))
    sched.storage_upserted(Kind.PVC, versioned(pvc("data"), uid="claim-1"))
    sched.pod_upserted(claimant("p", "data"))
    cycle(sched, "p")
    await settle()
    sched.storage_deleted(Kind.PVC, pvc("data"))
    await settle()
    ((_, message),) = conditions(writer, "p")
    assert message.endswith("PVC default/data was deleted before it was bound")
    assert writer.binds == []


async def test_unreadable_storage_is_skipped_and_reported() -> None:
    sched, _ = setup()
    broken = versioned(pv("bad", host="n0"))
    broken["spec"]["capacity"] = {"storage": "ten gigs"}
    sched.storage_upserted(Kind.PV, broken)
    assert "bad" not in sched.cache.volumes.pvs
    assert "persistentvolume/bad" in sched.storage.broken
    assert "bad" in sched.storage.keys(Kind.PV)  # a re-list still reconciles it
    sched.storage_upserted(Kind.PV, versioned(pv("bad", host="n0")))
    assert "persistentvolume/bad" not in sched.storage.broken
    assert sched.cache.volumes.pvs["bad"].capacity.nanos > 0


async def test_a_bound_claim_only_binds_the_pod_on_its_pv_node() -> None:
    sched, writer = setup()
    local_storage(sched)
    bound_pv = pv("pv-b", host="n1", claim=("default", "data"), phase="Bound")
    bound_pv["spec"]["claimRef"]["uid"] = "claim-1"
    sched.storage_upserted(Kind.PV, versioned(bound_pv))
    claim = pvc("data", volume_name="pv-b", bound=True)
    assert BIND_COMPLETED in claim["metadata"]["annotations"]
    sched.storage_upserted(Kind.PVC, versioned(claim, uid="claim-1"))
    sched.pod_upserted(claimant("p", "data"))
    cycle(sched, "p")
    await settle()
    assert writer.volume_patches == []  # nothing to write: no PreBind wait either
    assert writer.binds == [("p", "n1")]
    assert sched.queue.get(pod_key("default", "p")) is None


async def test_a_pod_deleted_while_its_volumes_bind_ends_the_wait() -> None:
    sched, writer = setup()
    local_storage(sched, ("pv-a", "n0"))
    sched.storage_upserted(Kind.PVC, versioned(pvc("data"), uid="claim-1"))
    body = claimant("p", "data")
    sched.pod_upserted(body)
    cycle(sched, "p")
    await settle()
    assert len(writer.volume_patches) == 1
    sched.pending_left(body, bound=False)  # deleted before the PV controller bound it
    await asyncio.sleep(1.2)  # the wait re-checks at least once a second
    assert writer.binds == []
    assert sched.cache.volumes.pvs["pv-a"].claim_ref is None  # given back
    assert sched.queue.get(pod_key("default", "p")) is None  # not queued again
    assert conditions(writer, "p") == []  # nothing said to a pod that is gone


async def test_a_claim_pod_preempts_only_where_its_volume_is() -> None:
    sched, writer = setup(nodes=3)
    local_storage(sched)
    bound_pv = pv("pv-b", host="n1", claim=("default", "data"), phase="Bound")
    bound_pv["spec"]["claimRef"]["uid"] = "claim-1"
    sched.storage_upserted(Kind.PV, versioned(bound_pv))
    sched.storage_upserted(
        Kind.PVC, versioned(pvc("data", volume_name="pv-b", bound=True), uid="claim-1")
    )
    for i in range(3):  # every node full of low-priority pods; n1's are the newest
        low = make_pod(f"low-{i}", "4").priority(1).obj()
        low["spec"]["nodeName"] = f"n{i}"
        low["metadata"]["resourceVersion"] = str(next(_rv))
        low["status"] = {"phase": "Running", "startTime": f"2026-01-0{3 - i}T00:00:00Z"}
        sched.pod_upserted(low)
    high = claimant("p", "data")
    high["spec"]["priority"] = 100
    sched.pod_upserted(high)
    cycle(sched, "p")
    await settle()
    assert writer.deletes == ["low-1"]  # the only node its PV allows, not the cheapest
    (nominated,) = [n for pod, _, _, n in writer.conditions if pod == "p"]
    assert nominated == "n1"


def gang_member(name: str, group: str, claim: str) -> dict[str, Any]:
    body = member(name, group, cpu="1")
    body["spec"]["volumes"] = [claim_volume("data", claim)]
    body["metadata"]["resourceVersion"] = str(next(_rv))
    return body


async def test_a_gang_sharing_a_bound_claim_lands_where_its_volume_is() -> None:
    sched, writer = setup(nodes=3)
    local_storage(sched)
    bound_pv = pv("dataset", host="n2", claim=("default", "data"), phase="Bound")
    bound_pv["spec"]["claimRef"]["uid"] = "claim-1"
    bound_pv["spec"]["accessModes"] = ["ReadWriteMany"]
    sched.storage_upserted(Kind.PV, versioned(bound_pv))
    claim = pvc("data", volume_name="dataset", bound=True, modes=("ReadWriteMany",))
    sched.storage_upserted(Kind.PVC, versioned(claim, uid="claim-1"))
    sched.podgroup_upserted(podgroup("train", 3))
    for name in ("w0", "w1", "w2"):
        sched.pod_upserted(gang_member(name, "train", "data"))
    await run_one(sched)
    assert sorted(writer.binds) == [("w0", "n2"), ("w1", "n2"), ("w2", "n2")]
    assert writer.volume_patches == []  # bound claims: nothing to write before binding


async def test_a_gang_with_an_unbound_claim_waits_with_a_clear_reason() -> None:
    sched, writer = setup(nodes=3)
    local_storage(sched, ("pv-a", "n0"))
    sched.storage_upserted(Kind.PVC, versioned(pvc("data"), uid="claim-1"))  # WFFC, unbound
    sched.podgroup_upserted(podgroup("train", 2))
    for name in ("w0", "w1"):
        sched.pod_upserted(gang_member(name, "train", "data"))
    await run_one(sched)
    assert writer.binds == []
    assert writer.volume_patches == []
    entry = entry_key("default/train")
    assert sched.queue.where(entry) is QueueName.UNSCHEDULABLE
    failed = [e[3] for e in writer.events if e[2] == "FailedScheduling" and "quorum" not in e[3]]
    assert failed
    assert failed[0] == (
        f'gang default/train: member default/w0: claim "data" is not bound; {GANG_CLAIMS_ADVICE}'
    )
    # The claim gets bound (say, by a user pre-binding it): the gang is woken and placed.
    bound_pv = pv("pv-a", host="n0", claim=("default", "data"), phase="Bound")
    bound_pv["spec"]["claimRef"]["uid"] = "claim-1"
    sched.storage_upserted(Kind.PV, versioned(bound_pv))
    sched.storage_upserted(
        Kind.PVC, versioned(pvc("data", volume_name="pv-a", bound=True), uid="claim-1")
    )
    assert sched.queue.where(entry) in (QueueName.ACTIVE, QueueName.BACKOFF)
    sched.queue.flush(now=float("inf"))
    await run_one(sched)
    assert sorted(writer.binds) == [("w0", "n0"), ("w1", "n0")]


async def test_a_prebind_the_pv_controller_never_completes_times_out_and_gives_the_pv_back() -> (
    None
):
    """kube's bindTimeoutSeconds (600 s): a claim whose PV is never bound fails the pod's
    PreBind as an error, the PV is offered again and nothing is bound. The wait is
    shortened here; its default is kube's."""
    sched, writer = setup()
    assert sched.storage.bind_timeout_s == 600.0
    sched.storage.bind_timeout_s = 0.3
    local_storage(sched, ("pv-a", "n0"))
    sched.storage_upserted(Kind.PVC, versioned(pvc("data"), uid="claim-1"))
    sched.pod_upserted(claimant("p", "data"))
    cycle(sched, "p")
    await settle()
    assert [p.name for p in writer.volume_patches] == ["pv-a"]
    assumed = sched.cache.volumes.pvs["pv-a"]
    assert assumed.claim_ref is not None  # assumed while it waits
    await sched.drain(5)
    assert writer.binds == []
    ((reason, message),) = conditions(writer, "p")
    assert reason == "SchedulerError"
    assert message == (
        'running PreBind plugin "VolumeBinding": '
        "binding volumes: timed out waiting for the condition after 0.3 s"
    )
    assert sched.queue.counts().get(QueueName.BACKOFF) == 1
    assert sched.cache.volumes.pvs["pv-a"].claim_ref is None, "the PV is offered again"
    assert sched.cache.snapshot.pod_counts.sum() == 0, "the node's room is given back"

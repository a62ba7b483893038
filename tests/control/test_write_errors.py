"""Issue #36: one rule for API errors on the write path. A writer that raises a transport
error (the connection dropped, refused, timed out) at any write of the binding cycle costs
the pod one attempt, never the pod: it is back in the queue with backoff and a
SchedulerError, nothing of it is left assumed (node room, devices, volumes), the claims
written for it are un-reserved, and the next attempt, with the fault gone, binds it."""

from __future__ import annotations

import argparse
import asyncio
import copy
import socket
import types
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import aiohttp
import pytest
from kubernetes_asyncio import client
from structlog.testing import capture_logs

from scheduler.control import cleanup as cleanup_module
from scheduler.control.dra import Kind
from scheduler.control.kubeio import BindOutcome, BindResult, KubeWriter, PodRef
from scheduler.control.queue import QueueName, pod_key
from scheduler.control.ratelimit import TokenBucket
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import parse_spec
from scheduler.control.storage import Kind as StorageKind
from scheduler.control.transient import describe, is_transient
from scheduler.core.dra.objects import ResourceClaim
from scheduler.core.dra.state import ClaimWrite, placeholder_key
from scheduler.core.volumes import VolumePatch
from scheduler.obs.metrics import Metrics
from tests.builders import make_node
from tests.control.test_dra_extended_flow import ExtendedWriter, gpu_class, gpu_pod
from tests.control.test_dra_flow import claim_pod
from tests.control.test_gangs import Clock, member, podgroup, run_one
from tests.control.test_volume_flow import (
    claimant,
    local_storage,
    pv_controller_binds,
    versioned,
)
from tests.core.dra.builders import claim, device, device_class, exactly, request, resource_slice
from tests.e2e.differential.volumes_objects import pvc


def _refused() -> aiohttp.ClientConnectorError:
    key = types.SimpleNamespace(host="api", port=6443, ssl=True, is_ssl=True)
    return aiohttp.ClientConnectorError(
        cast(Any, key), ConnectionRefusedError(111, "Connection refused")
    )


FAULTS: dict[str, Callable[[], BaseException]] = {
    "disconnected": aiohttp.ServerDisconnectedError,
    "refused": _refused,
    "reset": lambda: ConnectionResetError(104, "Connection reset by peer"),
    "timeout": asyncio.TimeoutError,
}


class FaultyWriter(ExtendedWriter):
    """ExtendedWriter (claims, extended-resource claims, bindings) plus deallocation and
    volume patches; ``faults`` maps a step to the exception it raises, once."""

    def __init__(self) -> None:
        super().__init__()
        self.faults: dict[str, BaseException] = {}
        self.deallocated: list[str] = []
        self.volume_patches: list[VolumePatch] = []

    def _fault(self, step: str) -> None:
        exc = self.faults.pop(step, None)
        if exc is not None:
            raise exc

    async def write_claim(
        self, write: ClaimWrite, *, pod_name: str, pod_uid: str
    ) -> tuple[dict[str, Any] | None, str | None]:
        self._fault("write")
        return await super().write_claim(write, pod_name=pod_name, pod_uid=pod_uid)

    async def unreserve_claim(self, write: ClaimWrite, *, pod_uid: str) -> str | None:
        self._fault("unreserve")
        return await super().unreserve_claim(write, pod_uid=pod_uid)

    async def deallocate_claim(
        self, claim: ResourceClaim, *, pod_uid: str
    ) -> tuple[dict[str, Any] | None, str | None]:
        self._fault("deallocate")
        self.deallocated.append(claim.name)
        body = copy.deepcopy(self.bodies[claim.name])
        body["metadata"]["resourceVersion"] = "9"
        body["status"] = {}
        return body, None

    async def create_claim(
        self, body: Any, *, pod_uid: str
    ) -> tuple[dict[str, Any] | None, str | None]:
        self._fault("create")
        return await super().create_claim(body, pod_uid=pod_uid)

    async def set_extended_claim_status(self, pod: PodRef, status: Any) -> str | None:
        self._fault("status")
        return await super().set_extended_claim_status(pod, status)

    async def delete_claim(self, namespace: str, name: str, uid: str) -> str | None:
        self._fault("delete")
        return await super().delete_claim(namespace, name, uid)

    async def bind(self, pod: PodRef, node: str, annotations: Any = None) -> Any:
        self._fault("bind")
        return await super().bind(pod, node, annotations)

    async def patch_volume(self, patch: VolumePatch) -> str | None:
        self._fault("volume")
        self.volume_patches.append(patch)
        return None


def make_scheduler(
    *claims: dict[str, Any], extended: bool = False
) -> tuple[Scheduler, FaultyWriter]:
    """Three nodes; n1 has one device ``gpu-0`` of class ``gpu`` (with ``extended``: 8,
    the class backing the extended resource ``example.com/gpu``)."""
    writer = FaultyWriter()
    sched = Scheduler(
        parse_spec({}, "lattice"),
        writer=cast(KubeWriter, writer),
        metrics=Metrics.create(),
        clock=Clock(),
        wall_clock=lambda: 0.0,
    )
    for i in range(3):
        sched.node_upserted(make_node(f"n{i}", cpu="4", memory="16Gi").obj())
    sched.dra_upserted(Kind.CLASS, gpu_class() if extended else device_class("gpu"))
    devices = [device(f"gpu-{i}") for i in range(8 if extended else 1)]
    sched.dra_upserted(Kind.SLICE, resource_slice("s", devices, node="n1"))
    for c in claims:
        writer.bodies[c["metadata"]["name"]] = c
        sched.dra_upserted(Kind.CLAIM, c)
    return sched, writer


async def settled(sched: Scheduler) -> None:
    """Bindings, their unwinding and the reports they send, all finished."""
    for _ in range(3):
        await sched.drain(30)


def assert_requeued(sched: Scheduler, writer: FaultyWriter, name: str, *, says: str) -> None:
    """Back in the queue (backoff) with a SchedulerError naming ``says``; not cached."""
    key = pod_key("default", name)
    assert sched.queue.where(key) is QueueName.BACKOFF, sched.queue.counts()
    assert sched.cache.cached_pod(key) is None, "nothing of the pod is left assumed"
    assert sched.cache.snapshot.pod_counts.sum() == 0, "its node's room is given back"
    failed = [e for e in writer.events if e[1] == name and e[2] == "FailedScheduling"]
    assert failed, writer.events
    assert says in failed[-1][3], failed[-1][3]
    reasons = [reason for pod, reason, _, _ in writer.conditions if pod == name]
    assert reasons[-1] == "SchedulerError"


async def retry_binds(sched: Scheduler, writer: FaultyWriter, name: str, node: str) -> None:
    assert not writer.faults, "the fault was raised"
    sched.queue.flush(now=float("inf"))  # past its backoff
    await run_one(sched)
    await settled(sched)
    assert (name, node) in writer.binds


def test_the_one_rule() -> None:
    for make in FAULTS.values():
        assert is_transient(make())
        assert describe(make()).startswith("connection: ")
    assert is_transient(client.ApiException(status=503))
    assert is_transient(client.ApiException(status=429))
    assert not is_transient(client.ApiException(status=409))
    assert not is_transient(ValueError("a bug"))


@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_a_lost_claim_write_requeues_the_pod_and_frees_its_device(fault: str) -> None:
    sched, writer = make_scheduler(claim("c", request("gpu", exactly("gpu"))))
    writer.faults["write"] = FAULTS[fault]()
    sched.pod_upserted(claim_pod("p", "c"))
    await run_one(sched)
    await settled(sched)
    assert writer.binds == []
    assert_requeued(sched, writer, "p", says='running PreBind plugin "DynamicResources": ')
    assert sched.cache.dra.pending_for(("default", "c")) is None
    assert sched.cache.dra.allocated_devices() == frozenset()
    await retry_binds(sched, writer, "p", "n1")


@pytest.mark.parametrize("fault", ["disconnected", "timeout"])
async def test_a_lost_binding_unreserves_the_claim_and_requeues(fault: str) -> None:
    body = claim_pod("p", "c")
    sched, writer = make_scheduler(claim("c", request("gpu", exactly("gpu"))))
    writer.faults["bind"] = FAULTS[fault]()
    sched.pod_upserted(body)
    await run_one(sched)
    await settled(sched)
    assert writer.binds == []
    assert writer.unreserved == [("c", body["metadata"]["uid"])]
    assert_requeued(sched, writer, "p", says="connection: ")
    assert sched.cache.dra.pending_for(("default", "c")) is None
    await retry_binds(sched, writer, "p", "n1")


async def test_a_lost_unreserve_after_a_failed_binding_still_requeues_the_pod() -> None:
    sched, writer = make_scheduler(claim("c", request("gpu", exactly("gpu"))))
    writer.fail.add("p")  # the binding answers 500
    writer.faults["unreserve"] = _refused()
    sched.pod_upserted(claim_pod("p", "c"))
    with capture_logs() as logs:
        await run_one(sched)
        await settled(sched)
    assert writer.binds == []
    assert_requeued(sched, writer, "p", says="500: injected")
    (unreserve,) = [e for e in logs if e["event"] == "claim_unreserve_failed"]
    assert "Cannot connect to host" in unreserve["reason"]
    assert sched.cache.dra.pending_for(("default", "c")) is None
    await retry_binds(sched, writer, "p", "n1")


async def test_a_lost_deallocation_is_logged_and_the_next_attempt_deallocates() -> None:
    """PostFilter's write for a claim whose allocation no node can use any more."""
    results = [{"request": "gpu", "driver": "gpu.example.com", "pool": "gone", "device": "d"}]
    selector = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gone"]}]}
        ]
    }
    allocated = {"allocation": {"devices": {"results": results}, "nodeSelector": selector}}
    sched, writer = make_scheduler(claim("c", request("gpu", exactly("gpu")), status=allocated))
    writer.faults["deallocate"] = aiohttp.ServerDisconnectedError()
    sched.pod_upserted(claim_pod("p", "c"))
    with capture_logs() as logs:
        await run_one(sched)
        await settled(sched)
    (failed,) = [e for e in logs if e["event"] == "claim_deallocation_failed"]
    assert "Server disconnected" in failed["reason"]
    assert writer.deallocated == []
    key = pod_key("default", "p")
    assert sched.queue.where(key) is QueueName.UNSCHEDULABLE
    sched.queue.flush(now=float("inf"))  # past the unschedulable timeout
    await run_one(sched)  # PostFilter again: deallocated this time, the pod retried
    await settled(sched)
    assert writer.deallocated == ["c"]
    sched.queue.flush(now=float("inf"))
    await run_one(sched)
    await settled(sched)
    assert writer.binds == [("p", "n1")]


@pytest.mark.parametrize("step", ["create", "status"])
async def test_a_lost_extended_claim_write_requeues_the_pod(step: str) -> None:
    sched, writer = make_scheduler(extended=True)
    writer.faults[step] = TimeoutError()
    body = gpu_pod()
    sched.pod_upserted(body)
    await run_one(sched)
    await settled(sched)
    assert writer.binds == []
    assert_requeued(sched, writer, "p", says='running PreBind plugin "DynamicResources": ')
    uid = body["metadata"]["uid"]
    assert sched.cache.dra.pending_for(placeholder_key("default", uid)) is None
    if step == "status":  # the claim it made is deleted, as kube's Unreserve
        assert writer.deleted == ["p-extended-resources-00001"]
    assert sched.cache.dra.allocated_devices() == frozenset()
    await retry_binds(sched, writer, "p", "n1")


async def test_a_lost_extended_claim_deletion_after_a_failed_binding_requeues_the_pod() -> None:
    sched, writer = make_scheduler(extended=True)
    writer.fail.add("p")
    writer.faults["delete"] = OSError(113, "No route to host")
    sched.pod_upserted(gpu_pod())
    await run_one(sched)
    await settled(sched)
    assert writer.binds == []
    assert_requeued(sched, writer, "p", says="500: injected")
    sched.queue.flush(now=float("inf"))
    await run_one(sched)  # PostFilter deletes the claim left behind, and retries the pod
    await settled(sched)
    assert writer.deleted == ["p-extended-resources-00001"]
    await retry_binds(sched, writer, "p", "n1")


async def test_a_lost_volume_patch_gives_the_pv_back_and_requeues_the_pod() -> None:
    sched, writer = make_scheduler()
    try:
        local_storage(sched, ("pv-a", "n2"))
        sched.storage_upserted(StorageKind.PVC, versioned(pvc("data"), uid="claim-1"))
        writer.faults["volume"] = aiohttp.ServerDisconnectedError()
        sched.pod_upserted(claimant("p", "data"))
        await run_one(sched)
        await settled(sched)
        assert writer.binds == []
        assert sched.cache.volumes.pvs["pv-a"].claim_ref is None  # the assumption is forgotten
        assert_requeued(sched, writer, "p", says='running PreBind plugin "VolumeBinding": ')
        sched.queue.flush(now=float("inf"))
        info = sched.queue.try_pop()
        assert info is not None
        sched.schedule_one(info)
        for _ in range(20):
            await asyncio.sleep(0)
        assert [p.name for p in writer.volume_patches] == ["pv-a"]
        pv_controller_binds(sched, "data", "claim-1", "pv-a", "n2")
        await settled(sched)
        assert writer.binds == [("p", "n2")]
    finally:
        await sched.shutdown(1.0)


async def test_a_bug_in_the_binding_task_unwinds_and_requeues_the_pod() -> None:
    """The last line of defence: not a transport error, yet the pod is not lost."""
    sched, writer = make_scheduler(claim("c", request("gpu", exactly("gpu"))))
    writer.faults["bind"] = RuntimeError("a bug")
    sched.pod_upserted(claim_pod("p", "c"))
    with capture_logs() as logs:
        await run_one(sched)
        await settled(sched)
    assert [e["event"] for e in logs if e["event"] == "binding_crashed"] == ["binding_crashed"]
    assert writer.unreserved, "the claim written is un-reserved"
    assert_requeued(sched, writer, "p", says="RuntimeError: a bug")
    assert sched.cache.dra.pending_for(("default", "c")) is None
    await retry_binds(sched, writer, "p", "n1")


async def test_a_gang_member_whose_lost_reply_binding_landed_is_not_assumed_again() -> None:
    """The binding landed, the watch showed it, then the reply was lost: the member is
    placed (no IllegalTransitionError: 'assume is illegal in state added'), not bound
    twice."""
    sched, writer = make_scheduler()
    sched.podgroup_upserted(podgroup("g", 2))
    bodies = {name: member(name, "g") for name in "ab"}
    for body in bodies.values():
        sched.pod_upserted(body)

    async def landed_then_lost(pod: PodRef, node: str, annotations: Any = None) -> BindOutcome:
        if pod.name != "a":
            outcome: BindOutcome = await FaultyWriter.bind(writer, pod, node, annotations)
            return outcome
        echo = copy.deepcopy(bodies["a"])
        echo["spec"]["nodeName"] = node
        echo["metadata"]["resourceVersion"] = "50"
        sched.pod_upserted(echo)  # the watch's echo overtakes the reply
        raise aiohttp.ServerDisconnectedError()

    writer.bind = landed_then_lost  # type: ignore[method-assign]
    with capture_logs() as logs:
        await run_one(sched)
        await settled(sched)
    assert not [e for e in logs if e.get("log_level") in ("error", "critical")], logs
    gang = sched.gang_flow.gangs.get("default/g")
    assert gang is not None
    key = pod_key("default", "a")
    assert key in gang.placed
    assert key not in gang.pending
    assert sched.cache.seen_bound(key, bodies["a"]["metadata"]["uid"]) is not None
    assert [n for n, _ in writer.binds] == ["b"]


@pytest.fixture
async def unreachable() -> AsyncIterator[KubeWriter]:
    """The real writer against an API server that refuses connections (a closed port):
    every request raises ``ClientConnectorError``."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = client.Configuration(host=f"http://127.0.0.1:{port}")
    async with client.ApiClient(config) as api:
        yield KubeWriter(api, component="lattice", instance="t", limiter=TokenBucket(1000.0, 1000))


async def test_every_write_of_the_real_writer_returns_a_lost_connection(
    unreachable: KubeWriter,
) -> None:
    writer = unreachable
    ref = PodRef("default", "p", "uid-p")
    write = ClaimWrite("default", "c", "uid-c", {"devices": {"results": []}})
    lost = "connection: ClientConnectorError"
    outcome = await writer.bind(ref, "n1")
    assert outcome.result is BindResult.ERROR
    assert lost in outcome.detail
    written, failed = await writer.write_claim(write, pod_name="p", pod_uid="uid-p")
    assert written is None
    assert failed is not None
    assert lost in failed
    assert lost in (await writer.unreserve_claim(write, pod_uid="uid-p") or "")
    claimed = ResourceClaim("default", "c", "uid-c")
    written, failed = await writer.deallocate_claim(claimed, pod_uid="uid-p")
    assert written is None
    assert lost in (failed or "")
    volume = VolumePatch("PersistentVolume", "", "pv-a", {"spec": {}})
    assert lost in (await writer.patch_volume(volume) or "")
    assert lost in (await writer.delete_claim("default", "c", "uid-c") or "")
    status = {"extendedResourceClaimStatus": None}
    assert lost in (await writer.set_extended_claim_status(ref, status) or "")


async def test_a_binding_whose_409_cannot_be_read_is_an_error() -> None:
    """The 409's read of the pod loses its connection: an error to retry, not a raise."""

    class Refusing:
        async def __call__(self, path: str, body: Any) -> None:
            raise client.ApiException(status=409, reason="Conflict")

    class Unreachable:
        async def read_namespaced_pod(self, *args: Any, **kwargs: Any) -> Any:
            raise aiohttp.ServerDisconnectedError()

    async with client.ApiClient() as api:
        writer = KubeWriter(
            api, component="lattice", instance="t", limiter=TokenBucket(1000.0, 1000)
        )
        writer._post = cast(Any, Refusing())
        writer._core = cast(Any, Unreachable())
        outcome = await writer.bind(PodRef("default", "p", "uid-p"), "n1")
    assert outcome.result is BindResult.ERROR
    assert "Server disconnected" in outcome.detail


async def test_the_cleanup_reports_a_lost_api_server(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``lattice cleanup``'s deletes: a refused connection is a message and exit 1, not a
    traceback."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    creds = types.SimpleNamespace(
        configuration=client.Configuration(host=f"http://127.0.0.1:{port}")
    )

    async def load(path: Any) -> Any:
        return creds

    monkeypatch.setattr(cleanup_module, "load_credentials", load)
    args = argparse.Namespace(
        kubeconfig=None,
        timeout=5.0,
        scheduler_name="lattice",
        keep_topologies=False,
        namespace="",
        lease_name="",
        test_name="",
    )
    assert await cleanup_module.cleanup(args) == 1
    err = capsys.readouterr().err
    assert "the API server did not answer (connection: ClientConnectorError" in err


@pytest.mark.parametrize("fault", ["disconnected", "bug"])
async def test_a_gang_member_whose_binding_task_raises_is_not_lost(fault: str) -> None:
    """A lost request re-places the member at once (as a failed binding); a bug gives it
    back to its gang instead, nothing of it assumed."""
    sched, writer = make_scheduler()
    sched.podgroup_upserted(podgroup("g", 2))
    for name in "ab":
        sched.pod_upserted(member(name, "g"))
    raised: BaseException = (
        aiohttp.ServerDisconnectedError() if fault == "disconnected" else RuntimeError("a bug")
    )
    original = writer.bind

    async def bind(pod: PodRef, node: str, annotations: Any = None) -> Any:
        if pod.name == "a" and writer.faults.pop("a", None) is not None:
            raise raised
        return await original(pod, node, annotations)

    writer.faults["a"] = raised
    writer.bind = bind  # type: ignore[method-assign]
    with capture_logs() as logs:
        await run_one(sched)
        await settled(sched)
    gang = sched.gang_flow.gangs.get("default/g")
    assert gang is not None
    key = pod_key("default", "a")
    if fault == "disconnected":
        assert sorted(n for n, _ in writer.binds) == ["a", "b"]
        assert key in gang.placed
        return
    assert [n for n, _ in writer.binds] == ["b"]
    assert [e["event"] for e in logs if e["event"] == "binding_crashed"] == ["binding_crashed"]
    assert key in gang.pending
    assert key not in gang.placed
    assert sched.cache.cached_pod(key) is None

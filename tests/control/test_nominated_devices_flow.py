"""A DRA preemption through the scheduler: the GPU its victim freed is held for the
nominated preemptor (Lattice beyond kube 1.37), so a lower-priority DRA pod arriving
meanwhile does not take it; the preemptor gets it, evicting nothing more. The hold ends
with the nomination (here: the preemptor deleted), and the lower-priority pod is placed.
The same with both pods asking for ``example.com/gpu`` served by DRA (a DeviceClass's
``extendedResourceName``): the GPU the preemptor's implicit claim would get is held."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.control.dra import Kind
from scheduler.control.queue import QueueName, pod_key
from scheduler.control.scheduler import Scheduler
from tests.builders import make_pod
from tests.control.test_dra_extended_flow import ExtendedWriter, gpu_class, gpu_pod
from tests.control.test_dra_flow import claim_pod, claim_scheduler
from tests.core.dra.builders import GPU_DRIVER, claim, exactly, request

VICTIM_UID = "victim-uid"


def gpu_claim(name: str, *, holder: str | None = None) -> dict[str, Any]:
    """A claim for one GPU; with ``holder``, allocated n1's gpu-0 and reserved for it."""
    status = None
    if holder is not None:
        results = [{"request": "gpu", "driver": GPU_DRIVER, "pool": "n1", "device": "gpu-0"}]
        status = {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": "v", "uid": holder}],
        }
    return claim(name, request("gpu", exactly("gpu")), status=status)


def with_priority(body: dict[str, Any], priority: int) -> dict[str, Any]:
    body["spec"]["priority"] = priority
    return body


async def attempt(sched: Scheduler, name: str) -> None:
    """One attempt of ``name`` as the run loop makes it (a DRA pod's deferred search)."""
    info = sched.queue.try_pop()
    assert info is not None
    assert info.pod.name == name
    await sched.attempt(info)
    await sched.drain(30)


def asking(name: str, extended: bool) -> dict[str, Any]:
    """A pod for one GPU: its claim ``c-<name>``, or ``example.com/gpu: 1`` (``extended``)."""
    return gpu_pod(name, "1") if extended else claim_pod(name, f"c-{name}")


@pytest.mark.parametrize("extended", [False, True], ids=["claims", "extended"])
@pytest.mark.parametrize("ending", ["binds", "deleted"])
async def test_the_freed_gpu_waits_for_the_preemptor(ending: str, extended: bool) -> None:
    victim_claim = gpu_claim("c-v", holder=VICTIM_UID)
    sched, writer = claim_scheduler(
        victim_claim, gpu_claim("c-hi"), gpu_claim("c-lo"), writer=ExtendedWriter()
    )
    if extended:
        sched.dra_upserted(Kind.CLASS, gpu_class())
    victim = make_pod("v", "100m").priority(1).uid(VICTIM_UID).obj()
    victim["spec"]["nodeName"] = "n1"
    victim["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "c-v"}]
    victim["status"] = {"phase": "Running"}
    sched.pod_upserted(victim)
    hi = with_priority(asking("hi", extended), 100)
    sched.pod_upserted(hi)
    await attempt(sched, "hi")
    assert writer.deletes == ["v"]
    assert [node for pod, node in sched.nominated() if pod.name == "hi"] == ["n1"]
    # The victim is gone, and kube-controller-manager released its claim: gpu-0 is free.
    sched.pod_deleted(victim)
    sched.dra_deleted(Kind.CLAIM, victim_claim)
    assert sched.cache.dra.allocated_devices() == frozenset()
    sched.pod_upserted(with_priority(asking("lo", extended), 10))
    await attempt(sched, "lo")
    assert writer.binds == []
    assert writer.written == []
    lo = pod_key("default", "lo")
    assert sched.queue.where(lo) is QueueName.UNSCHEDULABLE
    (event,) = [e for e in writer.events if e[2] == "FailedScheduling" and e[1] == "lo"]
    assert "cannot allocate all claims" in event[3]
    assert writer.deletes == ["v"]  # nothing else to evict for it
    if ending == "binds":
        sched.queue.flush(now=float("inf"))
        await attempt(sched, "hi")
        assert writer.binds == [("hi", "n1")]
        assert writer.written == ["hi-extended-resources-00001" if extended else "c-hi"]
        assert writer.deletes == ["v"]  # the preemptor did not have to evict again
        return
    sched.pending_left(hi, bound=False)  # the preemptor is deleted: its hold ends
    assert sched.queue.where(lo) in (QueueName.ACTIVE, QueueName.BACKOFF)
    sched.queue.flush(now=float("inf"))
    await attempt(sched, "lo")
    assert writer.binds == [("lo", "n1")]
    assert writer.written == ["lo-extended-resources-00001" if extended else "c-lo"]

"""The loop never waits on a device search: a hostile DRA pod's search runs in the worker
within its budget, other tasks keep running, and the pod ends with a FailedScheduling
that names the budget."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any, cast

import pytest

from scheduler.control import scheduler as scheduler_module
from scheduler.control.dra import Kind
from scheduler.control.kubeio import KubeWriter
from scheduler.control.queue import QueuedPodInfo, QueueName, pod_key
from scheduler.control.queued import QueuedPod
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import SettingsError, parse_dra, parse_spec
from scheduler.core.dra.search import SEARCH_BUDGET
from scheduler.model.release import DEFAULT_KUBE_MINOR
from scheduler.obs.metrics import Metrics
from tests.builders import make_node, make_pod
from tests.control.test_dra_flow import ClaimWriter
from tests.control.test_gangs import Clock
from tests.core.dra.builders import (
    claim,
    device,
    device_class,
    exactly,
    first_available,
    resource_slice,
)

BUDGET = 1.0
HOSTILE = 16
"""Two claims of 9 on 16 devices, each a firstAvailable list of one: only the search can
tell they do not fit together (the allocator's count check covers plain ExactCount
requests only)."""
CLAIMS = {
    name: claim(name, first_available("gpu", ("nine", exactly("gpu", count=9))))
    for name in ("a", "b")
}


def hostile(sched: Scheduler, nodes: int, *, devices: int = HOSTILE) -> dict[str, Any]:
    sched.dra_upserted(Kind.CLASS, device_class("gpu"))
    for i in range(nodes):
        body = resource_slice(
            f"n{i}-gpus", [device(f"gpu-{d}") for d in range(devices)], node=f"n{i}"
        )
        sched.dra_upserted(Kind.SLICE, body)
    for body in CLAIMS.values():
        sched.dra_upserted(Kind.CLAIM, body)
    body = make_pod("hostile", "100m").obj()
    body["spec"]["schedulerName"] = "lattice"
    body["spec"]["resourceClaims"] = [
        {"name": "a", "resourceClaimName": "a"},
        {"name": "b", "resourceClaimName": "b"},
    ]
    sched.pod_upserted(body)
    return body


def budgeted(
    nodes: int, kube_minor: int = DEFAULT_KUBE_MINOR, budget: float = BUDGET
) -> tuple[Scheduler, ClaimWriter]:
    writer = ClaimWriter(CLAIMS)
    sched = Scheduler(
        parse_spec({"dra": {"searchBudgetSeconds": budget}}, "lattice", kube_minor=kube_minor),
        writer=cast(KubeWriter, writer),
        metrics=Metrics.create(),
        clock=Clock(),
        wall_clock=lambda: 0.0,
    )
    for i in range(nodes):
        sched.node_upserted(make_node(f"n{i}", cpu="4", memory="16Gi").obj())
    return sched, writer


async def ticker(stop: asyncio.Event, gaps: list[float]) -> None:
    last = time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(0.01)
        now = time.monotonic()
        gaps.append(now - last)
        last = now


def popped(sched: Scheduler) -> QueuedPodInfo[QueuedPod]:
    info = sched.queue.try_pop()
    assert info is not None
    return info


async def attempted(sched: Scheduler) -> None:
    """The next pod's attempt, and its search (in the worker, if any) to the end."""
    await sched.attempt(popped(sched))
    await sched.drain(5)


async def test_other_tasks_run_while_a_hostile_search_is_in_progress() -> None:
    """Without the worker, each of the 4 nodes holds the loop for kube's 10 s timeout."""
    sched, writer = budgeted(4)
    hostile(sched, 4)
    info = popped(sched)
    stop, gaps = asyncio.Event(), list[float]()
    tick = asyncio.create_task(ticker(stop, gaps))
    started = time.monotonic()
    await sched.attempt(info)
    assert time.monotonic() - started < 0.5, "the search goes on in a task of its own"
    await sched.drain(10)
    took = time.monotonic() - started
    stop.set()
    await tick
    assert BUDGET * 0.9 <= took < BUDGET + 1.5
    assert len(gaps) > 20, "the ticker ran during the search"
    assert max(gaps) < 0.25, f"the loop stalled {max(gaps):.3f}s"
    # kube 1.37: a node search that does not end is an error of the attempt: backoff.
    assert sched.queue.where(pod_key("default", "hostile")) is QueueName.BACKOFF
    (event,) = [e for e in writer.events if e[2] == "FailedScheduling"]
    assert "the device search budget (1s per attempt) ran out" in event[3]
    assert writer.binds == []


async def test_a_hostile_pod_on_1_35_is_unschedulable_naming_the_budget() -> None:
    sched, writer = budgeted(3, kube_minor=35)
    hostile(sched, 3)
    await attempted(sched)
    assert sched.queue.where(pod_key("default", "hostile")) is QueueName.UNSCHEDULABLE
    (event,) = [e for e in writer.events if e[2] == "FailedScheduling"]
    assert event[3].startswith(
        "0/3 nodes are available: 3 node(s) not searched: the device search budget "
        "(1s per attempt) ran out after 1 node(s)."
    )


@pytest.fixture
def no_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node the memo does not know goes to the worker (no search on the loop)."""
    monkeypatch.setattr(scheduler_module, "INLINE", 0.0)


async def test_a_quick_search_is_done_on_the_loop_in_the_first_decision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The usual DRA pod: its unknown nodes take less than the inline allowance (5 s
    here, so a loaded machine's first CEL compile cannot run past it), so the first
    decision places it, with no second decision after a worker's search."""
    monkeypatch.setattr(scheduler_module, "INLINE", 5.0)
    sched, writer = budgeted(3)
    hostile(sched, 3, devices=18)
    info = popped(sched)
    await sched.attempt(info)
    assert not sched._searches, "no search was left to the worker"
    await sched.drain(5)
    assert [b[1] for b in writer.binds] in (["n0"], ["n1"], ["n2"])


async def test_a_search_past_the_inline_allowance_goes_to_the_worker() -> None:
    """The hostile pod's first node runs past the allowance on the loop: it is cut there
    and searched in the worker, within the budget, as before."""
    sched, _ = budgeted(2)
    hostile(sched, 2)
    info = popped(sched)
    started = time.monotonic()
    await sched.attempt(info)
    assert time.monotonic() - started < 0.5
    assert sched._searches, "the search went on in a task of its own"
    await sched.drain(10)


async def test_a_budget_that_ends_during_the_inline_search_cuts_that_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A budget shorter than the allowance ends the search on the loop: that node is the
    one the budget cut, an error of the attempt on 1.37 as if the worker had cut it."""
    monkeypatch.setattr(scheduler_module, "INLINE", 5.0)
    sched, writer = budgeted(2, budget=0.002)
    hostile(sched, 2)
    await attempted(sched)
    assert sched.queue.where(pod_key("default", "hostile")) is QueueName.BACKOFF
    (event,) = [e for e in writer.events if e[2] == "FailedScheduling"]
    assert "budget (0.002s per attempt) ran out while allocating devices" in event[3]


@pytest.mark.usefixtures("no_inline")
async def test_a_pod_whose_nodes_the_worker_searched_is_placed() -> None:
    sched, writer = budgeted(3)
    hostile(sched, 3, devices=18)
    await attempted(sched)
    assert [b[1] for b in writer.binds] in (["n0"], ["n1"], ["n2"])


@pytest.mark.usefixtures("no_inline")
async def test_a_pod_deleted_during_its_search_is_not_placed() -> None:
    sched, writer = budgeted(3)
    body = hostile(sched, 3, devices=18)
    info = popped(sched)
    attempt = asyncio.create_task(sched.attempt(info))
    await asyncio.sleep(0)  # the attempt hands its nodes to the worker
    sched.pod_deleted(body)
    await attempt
    await sched.drain(5)
    assert writer.binds == []
    assert sched.cache.pod_keys() == set()


async def test_plain_pods_are_placed_while_a_hostile_search_runs() -> None:
    sched, writer = budgeted(4)
    hostile(sched, 4)
    body = make_pod("plain", "100m").obj()
    body["spec"]["schedulerName"] = "lattice"
    first = sched.queue.try_pop()
    assert first is not None
    await sched.attempt(first)  # the hostile pod: its search goes to the worker
    sched.pod_upserted(body)
    second = sched.queue.try_pop()
    assert second is not None
    assert second.pod.name == "plain"
    await sched.attempt(second)
    await asyncio.sleep(0.2)
    assert [b[0] for b in writer.binds] == ["plain"], "bound while the search runs"
    assert sched.queue.where(pod_key("default", "hostile")) is QueueName.IN_FLIGHT
    await sched.drain(10)
    assert sched.queue.where(pod_key("default", "hostile")) is QueueName.BACKOFF


async def test_a_shutdown_cancels_the_search_instead_of_waiting_out_its_budget() -> None:
    """SIGTERM's shutdown waits for bindings, not for a hostile pod's search: with a 30 s
    budget and a 60 s grace, waiting would hold the lease's release for 30 s."""
    sched, writer = budgeted(4, budget=30.0)
    hostile(sched, 4)
    info = popped(sched)
    await sched.attempt(info)
    await asyncio.sleep(0.3)  # the worker is searching
    assert sched.queue.where(pod_key("default", "hostile")) is QueueName.IN_FLIGHT
    started = time.monotonic()
    await sched.shutdown(60)
    took = time.monotonic() - started
    assert took < 10, f"shutdown waited {took:.1f}s for the search"
    assert writer.binds == []
    assert writer.events == []


def test_the_worker_sees_the_loop_busy_while_pods_wait_for_a_cycle() -> None:
    """What makes the worker pause longer (BUSY_PAUSE): pods in the active queue."""
    sched, _ = budgeted(1)
    search = sched._device_search()
    assert not search.loop_busy()
    body = make_pod("plain", "100m").obj()
    body["spec"]["schedulerName"] = "lattice"
    sched.pod_upserted(body)
    assert search.loop_busy()
    assert sched.queue.try_pop() is not None
    assert not search.loop_busy()


def test_the_search_worker_runs_at_the_lowest_cpu_priority() -> None:
    """Where the scheduler shares cores with the API server, a hostile search takes only
    the CPU nothing else wants (a thread's own nice value, Linux)."""
    sched, _ = budgeted(1)

    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    assert sched._search_pool.submit(nice).result(timeout=5) == 19
    assert nice() != 19  # the loop's thread keeps its own


def test_the_budget_is_a_setting_within_bounds() -> None:
    assert parse_dra({"searchBudgetSeconds": 0.5}).search_budget == 0.5
    assert parse_dra(None).search_budget == SEARCH_BUDGET == 10.0
    for bad in (0, -1, 61, True, "1"):
        with pytest.raises(SettingsError, match="searchBudgetSeconds"):
            parse_dra({"searchBudgetSeconds": bad})

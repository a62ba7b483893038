"""/livez, /healthz and /readyz: a stalled loop or a lost lease fails /healthz; an idle
leader and a standby are healthy."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client import CollectorRegistry

from scheduler.config import RunConfig
from scheduler.control.app import STALL_AFTER, App
from scheduler.control.leader import Elector
from scheduler.control.queue import SchedulingQueue
from scheduler.control.scheduler import Scheduler
from scheduler.control.server import start_server
from scheduler.control.settings import parse_spec
from scheduler.obs.metrics import Metrics
from tests.builders import make_pod
from tests.control.builders import FakeClock, make_queue, pop
from tests.control.builders import make_pod as fake_pod


def test_an_idle_queue_is_not_starved() -> None:
    queue, clock = make_queue()
    clock.advance(1000)
    assert queue.starved_for() == 0


def test_starvation_counts_from_when_pods_became_poppable_or_the_last_pop() -> None:
    queue, clock = make_queue()
    clock.advance(500)  # idle time never counts
    queue.add(fake_pod("a"))
    queue.add(fake_pod("b"))
    clock.advance(7)
    assert queue.starved_for() == 7
    pop(queue)
    assert queue.starved_for() == 0
    clock.advance(3)
    assert queue.starved_for() == 3
    assert queue.starved_for(since=clock.now() - 1) == 1  # leading for a second only
    pop(queue)
    clock.advance(100)
    assert queue.starved_for() == 0, "nothing left to pop"
    queue.close()
    queue.add(fake_pod("c"))
    assert queue.starved_for() == 0, "closed: shutting down"


def app_with(clock: FakeClock) -> App:
    app = App(RunConfig())
    app.scheduler = Scheduler(parse_spec({}, "lattice"), writer=None, metrics=Metrics.create())
    app.scheduler.queue = SchedulingQueue(clock=clock)
    return app


def pending(app: App, name: str) -> None:
    body = make_pod(name, "1").obj()
    body["spec"]["schedulerName"] = "lattice"
    app.scheduler.pod_upserted(body)


def test_a_standby_with_pods_waiting_is_healthy() -> None:
    clock = FakeClock()
    app = app_with(clock)
    pending(app, "p")
    clock.advance(10 * STALL_AFTER)
    assert app.health() is None


def test_a_leader_that_stops_popping_is_unhealthy_and_an_idle_one_is_not() -> None:
    clock = FakeClock()
    app = app_with(clock)
    clock.advance(10 * STALL_AFTER)
    app._leading_since = clock.now()
    clock.advance(10 * STALL_AFTER)
    assert app.health() is None, "idle"
    pending(app, "p")
    clock.advance(STALL_AFTER / 2)
    assert app.health() is None, "pods are fine for a while"
    clock.advance(STALL_AFTER)
    problem = app.health()
    assert problem is not None
    assert "stalled" in problem
    assert app.scheduler.queue.try_pop() is not None
    assert app.health() is None


async def test_a_lost_lease_is_unhealthy() -> None:
    app = app_with(FakeClock())
    app._elector = Elector(None, RunConfig().leader_election, asyncio.sleep)  # type: ignore[arg-type]
    assert app.health() is None
    app._elector.lost.set()
    assert app.health() == "the leader lease was lost"


async def test_endpoints() -> None:
    problem: list[str] = []
    runner, port = await start_server(
        CollectorRegistry(),
        lambda: True,
        "127.0.0.1",
        0,
        health=lambda: problem[0] if problem else None,
    )
    try:
        async with aiohttp.ClientSession() as http:

            async def get(path: str) -> tuple[int, str]:
                async with http.get(f"http://127.0.0.1:{port}{path}") as resp:
                    return resp.status, await resp.text()

            assert await get("/livez") == (200, "ok")
            assert await get("/healthz") == (200, "ok")
            assert await get("/readyz") == (200, "ok")
            problem.append("the scheduling loop stalled")
            assert await get("/healthz") == (503, "the scheduling loop stalled")
            assert await get("/livez") == (200, "ok"), "alive, only unhealthy"
    finally:
        await runner.cleanup()

"""The write path: bindings and reports are paced by separate buckets, so a burst of events
or status patches never delays a binding; the Scheduled event can be switched off."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web
from kubernetes_asyncio import client

from scheduler.control import kubeio
from scheduler.control.kubeio import (
    KEEPALIVE_S,
    BindResult,
    JsonPoster,
    KubeWriter,
    PodRef,
    keep_connections_open,
)
from scheduler.control.ratelimit import TokenBucket
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import SettingsError, parse_spec
from scheduler.obs.metrics import Metrics
from tests.builders import make_node, make_pod
from tests.control.test_gangs import FakeWriter

REF = PodRef("default", "p", "uid-p")


class FakePoster:
    """The writer's POSTs (bindings, Events), answered at once."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def __call__(self, path: str, body: Mapping[str, Any]) -> None:
        self.calls.append("bind" if path.endswith("/binding") else "event")


async def test_a_binding_never_waits_behind_reports() -> None:
    async with client.ApiClient() as api:
        writer = KubeWriter(
            api, component="lattice", instance="t", limiter=TokenBucket(1000.0, 1000)
        )
        writer.report_limiter.reconfigure(0.01, 1)  # one report now, the next in 100 s
        core = FakePoster()
        writer._post = cast(JsonPoster, core)
        await writer.event(REF, reason="FailedScheduling", message="first")
        stuck = asyncio.ensure_future(writer.event(REF, reason="FailedScheduling", message="2"))
        await asyncio.sleep(0)
        outcome = await asyncio.wait_for(writer.bind(REF, "n1"), timeout=5)
        assert outcome.node == "n1"
        assert core.calls == ["event", "bind"]
        assert not stuck.done()
        stuck.cancel()
        await asyncio.gather(stuck, return_exceptions=True)


async def test_reconfigure_paces_both_buckets() -> None:
    async with client.ApiClient() as api:
        writer = KubeWriter(api, component="lattice", instance="t", limiter=TokenBucket(50, 10))
        assert (writer.report_limiter.qps, writer.report_limiter.burst) == (50, 10)
        assert writer.report_limiter is not writer.limiter
        writer.reconfigure(200, 400)
        assert (writer.limiter.qps, writer.limiter.burst) == (200, 400)
        assert (writer.report_limiter.qps, writer.report_limiter.burst) == (200, 400)


async def test_scheduled_events_can_be_switched_off() -> None:
    for enabled in (True, False):
        writer = FakeWriter()
        sched = Scheduler(
            parse_spec({"scheduledEvents": enabled}, "lattice"),
            writer=cast(KubeWriter, writer),
            metrics=Metrics.create(),
        )
        sched.node_upserted(make_node("n0", cpu="4", memory="16Gi").obj())
        body = make_pod("web", "100m").obj()
        body["spec"]["schedulerName"] = "lattice"
        sched.pod_upserted(body)
        info = sched.queue.try_pop()
        assert info is not None
        sched.schedule_one(info)
        await sched.drain(10)
        assert writer.binds == [("web", "n0")]
        scheduled = [e for e in writer.events if e[2] == "Scheduled"]
        assert len(scheduled) == (1 if enabled else 0)


def test_scheduled_events_must_be_a_boolean() -> None:
    with pytest.raises(SettingsError, match=r"spec\.scheduledEvents"):
        parse_spec({"scheduledEvents": "no"}, "lattice")


class RefusingPoster:
    def __init__(self, status: int) -> None:
        self.status = status

    async def __call__(self, path: str, body: Mapping[str, Any]) -> None:
        if self.status >= 300:
            exc = client.ApiException(status=self.status, reason="x")
            exc.body = b'{"message": "refused"}'
            raise exc


class ReadingCore:
    """The read after a 409."""

    def __init__(self, node: str | None) -> None:
        self.node = node

    async def read_namespaced_pod(self, *args: Any, **kwargs: Any) -> Any:
        return client.V1Pod(
            metadata=client.V1ObjectMeta(uid=REF.uid),
            spec=client.V1PodSpec(containers=[], node_name=self.node),
        )


@pytest.mark.parametrize(
    ("status", "node", "result"),
    [
        (201, None, BindResult.BOUND),
        (404, None, BindResult.GONE),
        (409, "n9", BindResult.BOUND_ELSEWHERE),
        (409, "n1", BindResult.BOUND),
        (429, None, BindResult.ERROR),
        (500, None, BindResult.ERROR),
    ],
)
async def test_a_binding_reply_is_judged_by_its_status(
    status: int, node: str | None, result: BindResult
) -> None:
    async with client.ApiClient() as api:
        writer = KubeWriter(api, component="lattice", instance="t", limiter=TokenBucket(100, 10))
        writer._post = cast(JsonPoster, RefusingPoster(status))
        writer._core = cast(client.CoreV1Api, ReadingCore(node))
        outcome = await writer.bind(REF, "n1")
    assert outcome.result is result


@pytest.mark.parametrize("status", [201, 404, 409, 429, 500])
async def test_the_poster_sends_json_with_credentials_and_judges_the_status(status: int) -> None:
    """A real HTTP server on loopback: the body, the token the configuration gives, the
    status; a non-2xx answer is an ApiException carrying the server's message."""
    seen: list[tuple[str, str, dict[str, Any]]] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("Authorization", ""), await request.json()))
        return web.json_response({"kind": "Status", "message": "said so"}, status=status)

    app = web.Application()
    app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    config = client.Configuration(host=f"http://127.0.0.1:{port}")
    config.api_key = {"BearerToken": "secret-token"}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    try:
        async with client.ApiClient(config) as api:
            writer = KubeWriter(
                api, component="lattice", instance="t", limiter=TokenBucket(100, 10)
            )
            writer._core = cast(client.CoreV1Api, ReadingCore("n1"))
            outcome = await writer.bind(REF, "n1", {"lattice.dev/devices": "gpu0"})
    finally:
        await runner.cleanup()
    ((path, auth, body),) = seen
    assert path == "/api/v1/namespaces/default/pods/p/binding"
    assert auth == "Bearer secret-token"
    assert body["metadata"] == {
        "name": "p",
        "namespace": "default",
        "uid": "uid-p",
        "annotations": {"lattice.dev/devices": "gpu0"},
    }
    assert body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}
    expected = {
        201: BindResult.BOUND,
        404: BindResult.GONE,
        409: BindResult.BOUND,  # the read says it is on n1: an earlier try of ours
        429: BindResult.ERROR,
        500: BindResult.ERROR,
    }[status]
    assert outcome.result is expected
    if status in (429, 500):
        assert "said so" in outcome.detail


async def _serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


async def test_connections_are_opened_ahead_and_the_writes_reuse_them() -> None:
    """A real HTTP server on loopback counts the client's connections (peer ports): the
    warm-up opens as many as asked, with the token, and a burst of bindings then opens
    none of its own."""
    peers: dict[str, set[int]] = {"GET": set(), "POST": set()}
    auth: set[str] = set()

    async def version(request: web.Request) -> web.Response:
        peers["GET"].add(request.transport.get_extra_info("peername")[1])  # type: ignore[union-attr]
        auth.add(request.headers.get("Authorization", ""))
        await asyncio.sleep(0.05)  # all in flight at once, as the binder's would be
        return web.json_response({"major": "1", "minor": "34"})

    async def binding(request: web.Request) -> web.Response:
        peers["POST"].add(request.transport.get_extra_info("peername")[1])  # type: ignore[union-attr]
        await asyncio.sleep(0.01)
        return web.json_response({"kind": "Status", "status": "Success"}, status=201)

    app = web.Application()
    app.router.add_get("/version", version)
    app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", binding)
    runner, port = await _serve(app)
    config = client.Configuration(host=f"http://127.0.0.1:{port}")
    config.api_key = {"BearerToken": "secret-token"}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    try:
        async with client.ApiClient(config) as api:
            assert keep_connections_open(api)
            writer = KubeWriter(
                api, component="lattice", instance="t", limiter=TokenBucket(1000, 1000)
            )
            assert await writer.open_connections(8) == 8
            outcomes = await asyncio.gather(
                *(writer.bind(PodRef("default", f"p{i}", f"u{i}"), "n1") for i in range(8))
            )
    finally:
        await runner.cleanup()
    assert len(peers["GET"]) == 8
    assert auth == {"Bearer secret-token"}
    assert all(o.result is BindResult.BOUND for o in outcomes)
    assert peers["POST"] <= peers["GET"]  # no binding opened a connection of its own


async def test_opening_connections_is_best_effort(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refusals, a server that does not answer and an unreachable one cost the head start
    only (a bounded wait): how many answered."""
    monkeypatch.setattr(kubeio, "WARM_UP_TIMEOUT", aiohttp.ClientTimeout(total=0.5))

    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"kind": "Status"}, status=403)

    answer = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await answer.wait()  # until the test is over
        return web.json_response({})

    async def opened(port: int, count: int) -> int:
        async with client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")) as api:
            writer = KubeWriter(api, component="lattice", instance="t", limiter=TokenBucket(1, 1))
            return await writer.open_connections(count)

    refusing, hanging = web.Application(), web.Application()
    refusing.router.add_get("/version", refuse)
    hanging.router.add_get("/version", hang)
    refuser, refusing_port = await _serve(refusing)
    hanger, hanging_port = await _serve(hanging)
    try:
        assert await opened(refusing_port, 3) == 0
        started = asyncio.get_running_loop().time()
        assert await opened(hanging_port, 3) == 0
        assert asyncio.get_running_loop().time() - started < 10
    finally:
        answer.set()
        await refuser.cleanup()
        await hanger.cleanup()
    assert await opened(refusing_port, 2) == 0  # nobody listens there any more


async def test_idle_connections_outlive_aiohttps_default() -> None:
    """The generated client's connector keeps idle connections 15 s (aiohttp's default);
    ours stay below kube-apiserver's 90 s idle timeout, above the gaps between bursts."""
    async with client.ApiClient() as api:
        connector = api.rest_client.pool_manager.connector
        assert connector._keepalive_timeout == 15.0  # the default this changes
        assert keep_connections_open(api)
        assert connector._keepalive_timeout == KEEPALIVE_S
    assert 15.0 < KEEPALIVE_S < 90.0

"""The write path: bindings and reports are paced by separate buckets, so a burst of events
or status patches never delays a binding; the Scheduled event can be switched off."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from kubernetes_asyncio import client

from scheduler.control.kubeio import BindResult, KubeWriter, PodRef
from scheduler.control.ratelimit import TokenBucket
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import SettingsError, parse_spec
from scheduler.obs.metrics import Metrics
from tests.builders import make_node, make_pod
from tests.control.test_gangs import FakeWriter

REF = PodRef("default", "p", "uid-p")


class _Released:
    status = 201
    reason = "Created"

    def release(self) -> None:
        return None


class FakeCore:
    """The CoreV1Api calls KubeWriter makes, answered at once."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def create_namespaced_pod_binding(self, *args: Any, **kwargs: Any) -> _Released:
        self.calls.append("bind")
        return _Released()

    async def create_namespaced_event(self, *args: Any, **kwargs: Any) -> _Released:
        self.calls.append("event")
        return _Released()


async def test_a_binding_never_waits_behind_reports() -> None:
    async with client.ApiClient() as api:
        writer = KubeWriter(
            api, component="lattice", instance="t", limiter=TokenBucket(1000.0, 1000)
        )
        writer.report_limiter.reconfigure(0.01, 1)  # one report now, the next in 100 s
        core = FakeCore()
        writer._core = cast(client.CoreV1Api, core)
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


class _Answer:
    """A raw reply with a status: the generated client only checks it when it preloads."""

    def __init__(self, status: int, body: bytes = b"{}") -> None:
        self.status = status
        self.reason = "x"
        self._body = body

    def release(self) -> None:
        return None

    async def read(self) -> bytes:
        return self._body


class AnsweringCore:
    def __init__(self, status: int, node: str | None = None) -> None:
        self.status = status
        self.node = node

    async def create_namespaced_pod_binding(self, *args: Any, **kwargs: Any) -> _Answer:
        return _Answer(self.status, b'{"message": "refused"}')

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
        writer._core = cast(client.CoreV1Api, AnsweringCore(status, node))
        outcome = await writer.bind(REF, "n1")
    assert outcome.result is result

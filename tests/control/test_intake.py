"""The intake without a server: coalescing, batching, backpressure, list/watch/relist
control flow against a scripted fake API, fingerprints and the pod tracker's rule."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
import pytest
from kubernetes_asyncio import client

from scheduler.control import intake as intake_module
from scheduler.control.intake import (
    ASSIGNED_PODS,
    Batch,
    Event,
    EventType,
    Intake,
    IntakeSettings,
    Page,
    PendingVerdict,
    PodTracker,
    RawObject,
    Relisted,
    Unavailable,
    Update,
    assigned_pods,
    bound_fingerprint,
    coalesce,
    custom,
    merge,
    node_fingerprint,
    nodes,
    pending_pods,
    pod_fingerprint,
    slim_node,
    slim_pod,
)
from scheduler.model.errors import InvalidObjectError
from scheduler.model.node import Node
from scheduler.model.pod import Pod

pytestmark = pytest.mark.usefixtures("no_leaked_tasks")

A, M, D = EventType.ADDED, EventType.MODIFIED, EventType.DELETED


def obj(uid: str, rv: int = 1, **extra: Any) -> RawObject:
    return cast(
        RawObject,
        {"metadata": {"uid": uid, "name": uid, "resourceVersion": str(rv)}, **extra},
    )


def ev(kind: EventType, uid: str, rv: int = 1) -> Event:
    return Event(kind, uid, obj(uid, rv))


# -- coalescing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sequence", "expected"),
    [
        ([A], A),
        ([M], M),
        ([D], D),
        ([A, M], A),
        ([A, M, M], A),
        ([M, M], M),
        ([A, D], D),  # the consumer may have seen it in an earlier batch it still holds
        ([M, D], D),
        ([A, M, D], D),
        ([D, A], M),  # left the stream and came back: it existed before the batch
        ([M, D, A, M], M),
    ],
)
def test_merge_keeps_the_net_change(sequence: list[EventType], expected: EventType) -> None:
    merged: Event | None = None
    for rv, kind in enumerate(sequence, start=1):
        merged = merge(merged, ev(kind, "u", rv))
    assert merged is not None
    assert merged.type is expected
    assert merged.obj["metadata"]["resourceVersion"] == str(len(sequence))  # last body wins


def test_coalesce_orders_by_last_event_and_bounds_by_uid() -> None:
    events = [ev(A, "a", 1), ev(A, "b", 2), ev(M, "a", 3), ev(M, "c", 4), ev(D, "b", 5)]
    out = coalesce(events * 1)
    assert [(e.uid, e.type) for e in out.values()] == [("a", A), ("c", M), ("b", D)]
    many = coalesce(ev(M, f"u{i % 7}", i) for i in range(1000))
    assert len(many) == 7


# -- a scripted API -----------------------------------------------------------------------


@dataclass
class FakeContent:
    chunks: list[bytes]
    hold: asyncio.Event | None = None
    """When the chunks are used up: block until set (an idle watch), then end."""
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once every chunk was read (so the reader has applied them all)."""

    async def read(self, n: int) -> bytes:
        if self.chunks:
            return self.chunks.pop(0)
        self.drained.set()
        if self.hold is not None:
            await self.hold.wait()
        return b""


@dataclass
class FakeResponse:
    status: int
    body: bytes = b""
    content: FakeContent = field(default_factory=lambda: FakeContent([]))

    async def read(self) -> bytes:
        return self.body

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


Script = Callable[[dict[str, str]], FakeResponse]


class FakeApi:
    """Answers ``call_api`` from a function of the query; records every request."""

    def __init__(self, script: Script, *, notify_at: int = 0) -> None:
        self.script = script
        self.requests: list[dict[str, str]] = []
        self.notify_at = notify_at
        self.reached = asyncio.Event()
        """Set when ``notify_at`` requests have been made."""

    async def call_api(self, path: str, method: str, **kwargs: Any) -> FakeResponse:
        query = dict(kwargs["query_params"])
        query["path"] = path
        self.requests.append(query)
        if len(self.requests) >= self.notify_at:
            self.reached.set()
        await asyncio.sleep(0)
        return self.script(query)


def list_page(items: list[RawObject], rv: str, token: str = "") -> FakeResponse:
    meta: dict[str, str] = {"resourceVersion": rv}
    if token:
        meta["continue"] = token
    return FakeResponse(200, orjson.dumps({"metadata": meta, "items": items}))


def line(kind: str, body: RawObject | dict[str, Any]) -> bytes:
    return orjson.dumps({"type": kind, "object": body}) + b"\n"


def status(code: int) -> bytes:
    return orjson.dumps({"kind": "Status", "code": code, "message": f"code {code}"})


FAST = IntakeSettings(backoff_initial_s=0.001, backoff_max_s=0.001, unavailable_retry_s=0.01)


async def collect(intake: Intake, predicate: Callable[[list[Update]], bool]) -> list[Update]:
    got: list[Update] = []
    async with asyncio.timeout(5):
        while not predicate(got):
            got.extend(await intake.get())
    return got


def batches(updates: list[Update]) -> list[Batch]:
    return [u for u in updates if isinstance(u, Batch)]


def relists(updates: list[Update]) -> list[Relisted]:
    return [u for u in updates if isinstance(u, Relisted)]


async def test_paged_list_then_watch_from_the_first_pages_rv() -> None:
    hold = asyncio.Event()

    def script(q: dict[str, str]) -> FakeResponse:
        if q.get("watch"):
            return FakeResponse(200, content=FakeContent([line("ADDED", obj("c", 12))], hold=hold))
        if q.get("continue") == "t1":
            return list_page([obj("b", 7)], rv="11")  # later pages repeat the list's RV
        return list_page([obj("a", 5)], rv="10", token="t1")

    api = FakeApi(script)
    async with Intake(
        cast(client.ApiClient, api), [pending_pods("lattice")], settings=FAST
    ) as intake:
        await intake.wait_synced()
        got = await collect(intake, lambda g: bool(batches(g)))
        hold.set()
    (initial,) = relists(got)
    assert initial.initial
    assert [o["metadata"]["uid"] for o in initial.items] == ["a", "b"]
    assert initial.resource_version == "10"
    watch = next(r for r in api.requests if r.get("watch"))
    assert watch["resourceVersion"] == "10"
    assert watch["allowWatchBookmarks"] == "true"
    assert watch["fieldSelector"] == "spec.schedulerName=lattice,spec.nodeName="
    assert [(e.uid, e.type) for e in batches(got)[0].events] == [("c", A)]


async def test_watch_resumes_from_the_last_bookmark_without_relisting() -> None:
    hold = asyncio.Event()
    watches: list[str] = []

    def script(q: dict[str, str]) -> FakeResponse:
        if not q.get("watch"):
            return list_page([], rv="10")
        watches.append(q["resourceVersion"])
        if len(watches) == 1:  # one object, a bookmark, then the server closes the watch
            bookmark = {"kind": "Pod", "metadata": {"resourceVersion": "20"}}
            return FakeResponse(
                200, content=FakeContent([line("ADDED", obj("a", 15)), line("BOOKMARK", bookmark)])
            )
        return FakeResponse(200, content=FakeContent([line("MODIFIED", obj("a", 21))], hold=hold))

    api = FakeApi(script)
    async with Intake(cast(client.ApiClient, api), [nodes()], settings=FAST) as intake:
        got = await collect(
            intake, lambda g: any(e.type is M for b in batches(g) for e in b.events)
        )
        hold.set()
        stream = intake.streams["nodes"]
    assert watches[:2] == ["10", "20"]
    assert stream.stats.lists == 1
    assert stream.stats.relists == 0
    assert stream.stats.bookmarks == 1
    assert len(relists(got)) == 1


@pytest.mark.parametrize("how", ["http", "event"])
async def test_gone_relists_and_delivers_a_reconcile(how: str) -> None:
    hold = asyncio.Event()
    lists = 0
    watches = 0

    def script(q: dict[str, str]) -> FakeResponse:
        nonlocal lists, watches
        if not q.get("watch"):
            lists += 1
            items = [obj("a", 5), obj("b", 6)] if lists == 1 else [obj("b", 30)]
            return list_page(items, rv=str(10 * lists))
        watches += 1
        if watches == 1:
            if how == "http":
                return FakeResponse(410, status(410))
            return FakeResponse(
                200, content=FakeContent([line("ERROR", orjson.loads(status(410)))])
            )
        return FakeResponse(200, content=FakeContent([], hold=hold))

    api = FakeApi(script)
    async with Intake(cast(client.ApiClient, api), [nodes()], settings=FAST) as intake:
        got = await collect(intake, lambda g: len(relists(g)) == 2)
        hold.set()
    first, second = relists(got)
    assert first.initial
    assert not second.initial
    assert [o["metadata"]["uid"] for o in second.items] == ["b"]  # "a" disappeared
    assert second.resource_version == "20"


async def test_expired_continue_token_restarts_the_list() -> None:
    hold = asyncio.Event()
    calls: list[str] = []

    def script(q: dict[str, str]) -> FakeResponse:
        if q.get("watch"):
            return FakeResponse(200, content=FakeContent([], hold=hold))
        calls.append(q.get("continue", ""))
        if q.get("continue"):
            if calls.count("t") == 1:
                return FakeResponse(410, status(410))
            return list_page([obj("b", 1)], rv="99")
        return list_page([obj("a", 1)], rv=str(len(calls)), token="t")

    api = FakeApi(script)
    async with Intake(cast(client.ApiClient, api), [nodes()], settings=FAST) as intake:
        got = await collect(intake, lambda g: bool(relists(g)))
        hold.set()
    (listed,) = relists(got)
    assert calls == ["", "t", "", "t"]
    assert listed.resource_version == "3"  # the restarted list's first page
    assert [o["metadata"]["uid"] for o in listed.items] == ["a", "b"]


def pages(updates: list[Update]) -> list[Page]:
    return [u for u in updates if isinstance(u, Page)]


async def test_a_paged_stream_delivers_its_initial_list_page_by_page() -> None:
    hold = asyncio.Event()

    def script(q: dict[str, str]) -> FakeResponse:
        if q.get("watch"):
            return FakeResponse(200, content=FakeContent([line("ADDED", obj("c", 12))], hold=hold))
        if q.get("continue") == "t1":
            return list_page([obj("b", 7)], rv="10")
        return list_page([obj("a", 5)], rv="10", token="t1")

    api = FakeApi(script)
    async with Intake(cast(client.ApiClient, api), [assigned_pods()], settings=FAST) as intake:
        await intake.wait_synced()
        got = await collect(intake, lambda g: bool(batches(g)))
        hold.set()
    assert [[o["metadata"]["uid"] for o in p.items] for p in pages(got)] == [["a"], ["b"]]
    (closing,) = relists(got)
    assert (closing.initial, closing.paged, closing.items) == (True, True, ())
    kinds = [type(u).__name__ for u in got]
    assert kinds == ["Page", "Page", "Relisted", "Batch"]  # pages first, in order
    watch = next(r for r in api.requests if r.get("watch"))
    assert watch["resourceVersion"] == "10"


async def test_a_paged_list_cut_short_is_read_again_from_a_first_page() -> None:
    """Pages already delivered may show pods that the new list no longer has: the restart
    is marked ``first``, so the closing Relisted drops what only the old pages showed."""
    hold = asyncio.Event()
    calls: list[str] = []

    def script(q: dict[str, str]) -> FakeResponse:
        if q.get("watch"):
            return FakeResponse(200, content=FakeContent([], hold=hold))
        calls.append(q.get("continue", ""))
        if q.get("continue"):
            if calls.count("t") == 1:
                return FakeResponse(410, status(410))
            return list_page([obj("b", 1)], rv="99")
        first = [obj("a", 1), obj("gone", 1)] if len(calls) == 1 else [obj("a", 1)]
        return list_page(first, rv=str(len(calls)), token="t")

    api = FakeApi(script)
    async with Intake(cast(client.ApiClient, api), [assigned_pods()], settings=FAST) as intake:
        got = await collect(intake, lambda g: bool(relists(g)))
        hold.set()
    assert calls == ["", "t", "", "t"]
    got_pages = pages(got)
    last_start = max(i for i, p in enumerate(got_pages) if p.first)
    assert [[o["metadata"]["uid"] for o in p.items] for p in got_pages[last_start:]] == [
        ["a"],
        ["b"],
    ]
    assert [p.first for p in got_pages[last_start:]] == [True, False]
    (listed,) = relists(got)
    assert (listed.initial, listed.paged, listed.items) == (True, True, ())
    assert listed.resource_version == "3"  # the restarted list's first page


async def test_a_paged_stream_relists_page_by_page_after_gone() -> None:
    """At 30 000 bound pods a re-list held whole is the memory peak: after 410 Gone the
    paged stream's re-list comes page by page too, closed by a non-initial paged value."""
    hold = asyncio.Event()
    lists = 0
    watches = 0

    def script(q: dict[str, str]) -> FakeResponse:
        nonlocal lists, watches
        if not q.get("watch"):
            if q.get("continue"):
                return list_page([obj("c", 31)], rv=str(10 * lists))
            lists += 1
            items = [obj("a", 5), obj("b", 6)] if lists == 1 else [obj("b", 30)]
            return list_page(items, rv=str(10 * lists), token="t" if lists > 1 else "")
        watches += 1
        if watches == 1:
            return FakeResponse(
                200, content=FakeContent([line("ERROR", orjson.loads(status(410)))])
            )
        return FakeResponse(200, content=FakeContent([], hold=hold))

    api = FakeApi(script)
    async with Intake(cast(client.ApiClient, api), [assigned_pods()], settings=FAST) as intake:
        got = await collect(intake, lambda g: len(relists(g)) == 2)
        hold.set()
        stream = intake.streams[ASSIGNED_PODS]
    first, second = relists(got)
    assert (first.initial, first.paged) == (True, True)
    assert (second.initial, second.paged, second.items) == (False, True, ())
    assert second.resource_version == "20"
    relist_pages = [p for p in pages(got) if p.resource_version == "20"]
    assert [[o["metadata"]["uid"] for o in p.items] for p in relist_pages] == [["b"], ["c"]]
    assert [p.first for p in relist_pages] == [True, False]
    assert got.index(second) > got.index(relist_pages[-1])  # closed after its pages
    assert (stream.stats.lists, stream.stats.relists) == (1, 1)


async def test_a_first_page_supersedes_what_was_pending() -> None:
    """Events read before a 410 are older than the re-list: they must not be applied after
    its pages (they would take pods back to an older state)."""
    buffer = intake_module._Buffer(ASSIGNED_PODS, asyncio.Event(), max_pending=10)
    buffer.put_events([Event(M, "a", obj("a", 5))], "5")
    buffer.put_page(Page(ASSIGNED_PODS, (obj("x", 1),), "8"))  # an earlier attempt's page
    buffer.put_page(Page(ASSIGNED_PODS, (obj("a", 9),), "9", first=True))
    taken = buffer.take()
    assert [type(u).__name__ for u in taken] == ["Page"]
    assert cast(Page, taken[0]).resource_version == "9"


async def test_missing_resource_reports_once_counts_as_synced_and_retries() -> None:
    api = FakeApi(lambda q: FakeResponse(404, status(404)), notify_at=3)
    resource = custom("example.com", "v1", "widgets")
    async with Intake(cast(client.ApiClient, api), [resource], settings=FAST) as intake:
        async with asyncio.timeout(5):
            await intake.wait_synced()
        got = await intake.get()
        await asyncio.wait_for(api.reached.wait(), 5)
        assert intake.get_nowait() == []  # reported once, not on every retry
        task_alive = all(not t.done() for t in intake._tasks)
    assert got == [Unavailable(resource.key, 404, "code 404")]
    assert api.requests[0]["path"] == "/apis/example.com/v1/widgets"
    assert task_alive


async def test_one_read_is_one_batch_and_a_slow_consumer_gets_it_coalesced() -> None:
    hold = asyncio.Event()
    n = 50
    # One read of the socket: 50 updates of 5 objects, the last line split across reads.
    payload = b"".join(line("MODIFIED", obj(f"u{i % 5}", 100 + i)) for i in range(n))
    cut = len(payload) - 7
    content = FakeContent([payload[:cut], payload[cut:]], hold=hold)

    def script(q: dict[str, str]) -> FakeResponse:
        if not q.get("watch"):
            return list_page([obj(f"u{i}", 1) for i in range(5)], rv="10")
        return FakeResponse(200, content=content)

    api = FakeApi(script)
    async with Intake(cast(client.ApiClient, api), [nodes()], settings=FAST) as intake:
        await intake.wait_synced()
        await asyncio.wait_for(content.drained.wait(), 5)  # meanwhile the consumer was busy
        got = intake.get_nowait()
        hold.set()
    assert isinstance(got[0], Relisted)
    (batch,) = batches(got)
    assert len(batch.events) == 5
    assert {e.obj["metadata"]["resourceVersion"] for e in batch.events} == {
        str(100 + i) for i in range(n - 5, n)
    }
    assert batch.resource_version == str(100 + n - 1)


async def test_a_waiting_consumer_gets_one_batch_per_read() -> None:
    hold = asyncio.Event()
    chunk = b"".join(line("ADDED", obj(f"u{i}", 100 + i)) for i in range(20))

    def script(q: dict[str, str]) -> FakeResponse:
        if not q.get("watch"):
            return list_page([], rv="10")
        return FakeResponse(200, content=FakeContent([chunk], hold=hold))

    api = FakeApi(script)
    async with Intake(cast(client.ApiClient, api), [nodes()], settings=FAST) as intake:
        first = await intake.get()
        if not batches(first):  # the list and the read may land in one take or two
            first = await intake.get()
        hold.set()
    (batch,) = batches(first)
    assert [e.uid for e in batch.events] == [f"u{i}" for i in range(20)]


async def test_reader_stops_reading_at_max_pending_until_the_consumer_takes() -> None:
    hold = asyncio.Event()
    chunks = [line("ADDED", obj(f"u{i}", 100 + i)) for i in range(10)]

    def script(q: dict[str, str]) -> FakeResponse:
        if not q.get("watch"):
            return list_page([], rv="10")
        return FakeResponse(200, content=FakeContent(list(chunks), hold=hold))

    api = FakeApi(script)
    settings = IntakeSettings(max_pending=3, backoff_initial_s=0.001)
    async with Intake(cast(client.ApiClient, api), [nodes()], settings=settings) as intake:
        await intake.wait_synced()
        stream = intake.streams["nodes"]
        for _ in range(50):
            await asyncio.sleep(0)
        assert stream.stats.events == 3  # blocked: three distinct objects pending
        taken = batches(intake.get_nowait())
        for _ in range(50):
            await asyncio.sleep(0)
        assert stream.stats.events == 6
        hold.set()
    assert [e.uid for e in taken[0].events] == ["u0", "u1", "u2"]


async def test_close_cancels_and_awaits_every_stream() -> None:
    api = FakeApi(lambda q: FakeResponse(500, status(500)))
    intake = Intake(cast(client.ApiClient, api), [nodes(), pending_pods("x")], settings=FAST)
    intake.start()
    await asyncio.sleep(0.01)
    tasks = list(intake._tasks)
    await intake.close()
    assert tasks
    assert all(t.done() for t in tasks)
    assert not intake.synced  # 500s never sync a stream


async def test_a_bug_in_a_stream_reaches_the_consumer() -> None:
    api = FakeApi(lambda q: FakeResponse(200, b"[]"))  # a list body that is not an object
    async with Intake(cast(client.ApiClient, api), [nodes()], settings=FAST) as intake:
        with pytest.raises(AttributeError):
            await asyncio.wait_for(intake.wait_synced(), 5)
        with pytest.raises(AttributeError):
            intake.get_nowait()


def test_duplicate_stream_keys_are_refused() -> None:
    api = cast(client.ApiClient, FakeApi(lambda q: FakeResponse(500)))
    with pytest.raises(ValueError, match="duplicate"):
        Intake(api, [nodes(), nodes()])


# -- fingerprints -------------------------------------------------------------------------


def base_pod() -> dict[str, Any]:
    return {
        "metadata": {
            "uid": "u1",
            "name": "p",
            "namespace": "ns",
            "generation": 1,
            "resourceVersion": "10",
            "labels": {"app": "web"},
            "annotations": {"lattice.dev/devices": '{"gpus":[0]}', "other": "x"},
        },
        "spec": {
            "nodeName": "n1",
            "schedulerName": "lattice",
            "priority": 0,
            "containers": [
                {
                    "name": "c",
                    "image": "img:1",
                    "resources": {"requests": {"cpu": "100m"}},
                    "ports": [{"containerPort": 80}],
                }
            ],
            "initContainers": [{"name": "i", "resources": {}}],
            "tolerations": [],
            "volumes": [{"name": "v", "emptyDir": {}}],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "c", "ready": True, "restartCount": 0}],
        },
    }


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(body: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        at: Any = body
        for p in parents:
            at = at[int(p)] if isinstance(at, list) else at.setdefault(p, {})
        if isinstance(at, list) and int(last) == len(at):
            at.append(value)
        elif isinstance(at, list):
            at[int(last)] = value
        else:
            at[last] = value

    return apply


def _annotate(key: str, value: str) -> Callable[[dict[str, Any]], None]:
    def apply(body: dict[str, Any]) -> None:
        body["metadata"]["annotations"][key] = value

    return apply


POD_SAME = {
    "phase Pending -> Running": _set("status.phase", "Pending"),
    "a condition": _set("status.conditions.0.status", "False"),
    "container state": _set("status.containerStatuses.0.restartCount", 3),
    "pod IP": _set("status.podIP", "10.0.0.1"),
    "resourceVersion": _set("metadata.resourceVersion", "11"),
    "managedFields": _set("metadata.managedFields", [{"manager": "kubelet"}]),
    "other annotation": _set("metadata.annotations.other", "y"),
    "image": _set("spec.containers.0.image", "img:2"),
    "nominatedNodeName": _set("status.nominatedNodeName", "n2"),
    "resize deferred": _set(
        "status.conditions.1", {"type": "PodResizePending", "reason": "Deferred"}
    ),
    "volume mount": _set("spec.containers.0.volumeMounts", [{"name": "v", "mountPath": "/v"}]),
}

BIND_MOUNT = {"name": "v", "mountPath": "/v", "bindMountOptions": ["rro"]}

POD_DIFFERENT = {
    "uid": _set("metadata.uid", "u2"),
    "name": _set("metadata.name", "q"),
    "namespace": _set("metadata.namespace", "other"),
    "generation": _set("metadata.generation", 2),
    "labels": _set("metadata.labels.app", "db"),
    "deletionTimestamp": _set("metadata.deletionTimestamp", "2026-01-01T00:00:00Z"),
    "devices annotation": _annotate("lattice.dev/devices", "x"),
    "gpu-alignment annotation": _annotate("lattice.dev/gpu-alignment", "strict"),
    "nodeName": _set("spec.nodeName", "n2"),
    "schedulerName": _set("spec.schedulerName", "default-scheduler"),
    "priority": _set("spec.priority", 10),
    "schedulingGates": _set("spec.schedulingGates", [{"name": "g"}]),
    "nodeSelector": _set("spec.nodeSelector", {"zone": "a"}),
    "affinity": _set("spec.affinity", {"podAntiAffinity": {}}),
    "tolerations": _set("spec.tolerations", [{"key": "k", "operator": "Exists"}]),
    "topologySpreadConstraints": _set("spec.topologySpreadConstraints", [{"maxSkew": 1}]),
    "hostNetwork": _set("spec.hostNetwork", True),
    "container resources": _set("spec.containers.0.resources", {"requests": {"cpu": "1"}}),
    "container ports": _set("spec.containers.0.ports", [{"containerPort": 80, "hostPort": 80}]),
    "container added": _set("spec.containers.1", {"name": "d"}),
    "initContainer resources": _set("spec.initContainers.0.resources", {"limits": {"cpu": "1"}}),
    "initContainer sidecar": _set("spec.initContainers.0.restartPolicy", "Always"),
    # What node declared features a pod needs (NodeDeclaredFeatures).
    "restart rules": _set(
        "spec.containers.0.restartPolicyRules", [{"action": "RestartAllContainers"}]
    ),
    "init restart rules": _set(
        "spec.initContainers.0.restartPolicyRules", [{"action": "RestartAllContainers"}]
    ),
    "bind mount options": _set("spec.containers.0.volumeMounts", [BIND_MOUNT]),
    "init bind mount options": _set("spec.initContainers.0.volumeMounts", [BIND_MOUNT]),
    "ephemeral bind mount options": _set(
        "spec.ephemeralContainers", [{"name": "d", "volumeMounts": [BIND_MOUNT]}]
    ),
    "hostUsers": _set("spec.hostUsers", False),
    "overhead": _set("spec.overhead", {"cpu": "10m"}),
    "pod resources": _set("spec.resources", {"requests": {"cpu": "1"}}),
    "pvc volume": _set(
        "spec.volumes.0", {"name": "v", "persistentVolumeClaim": {"claimName": "c"}}
    ),
    "ephemeral volume": _set("spec.volumes.0", {"name": "v", "ephemeral": {}}),
    "disk volume": _set("spec.volumes.0", {"name": "v", "rbd": {}}),
    "volume renamed": _set("spec.volumes.0.name", "w"),
    "resourceClaims": _set("spec.resourceClaims", [{"name": "gpu"}]),
    "resourceClaimStatuses": _set(
        "status.resourceClaimStatuses", [{"name": "gpu", "resourceClaimName": "p-gpu-x1"}]
    ),
    "phase terminal": _set("status.phase", "Succeeded"),
    "status resources (resize)": _set(
        "status.containerStatuses.0.resources", {"requests": {"cpu": "2"}}
    ),
    "allocatedResources": _set(
        "status.containerStatuses.0",
        {
            "name": "c",
            "resources": {"requests": {"cpu": "100m"}},
            "allocatedResources": {"cpu": "2"},
        },
    ),
    # 1.37 reads allocatedResources without status.resources.
    "allocatedResources alone": _set("status.containerStatuses.0.allocatedResources", {"cpu": "2"}),
    "pod status resources": _set("status.resources", {"requests": {"cpu": "1"}}),
    "pod allocatedResources": _set("status.allocatedResources", {"cpu": "1"}),
    "init status resources": _set(
        "status.initContainerStatuses", [{"name": "i", "resources": {"requests": {"cpu": "1"}}}]
    ),
    "resize infeasible": _set(
        "status.conditions.1", {"type": "PodResizePending", "reason": "Infeasible"}
    ),
}


def _variant(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    body = copy.deepcopy(base_pod())
    change(body)
    return body


@pytest.mark.parametrize("change", POD_SAME.values(), ids=POD_SAME.keys())
def test_pod_fingerprint_ignores_what_scheduling_does_not_read(
    change: Callable[[dict[str, Any]], None],
) -> None:
    assert pod_fingerprint(_variant(change)) == pod_fingerprint(base_pod())


@pytest.mark.parametrize("change", POD_DIFFERENT.values(), ids=POD_DIFFERENT.keys())
def test_pod_fingerprint_sees_every_field_scheduling_reads(
    change: Callable[[dict[str, Any]], None],
) -> None:
    assert pod_fingerprint(_variant(change)) != pod_fingerprint(base_pod())


def test_the_echo_of_our_binding_matches_the_bound_fingerprint() -> None:
    pending = base_pod()
    del pending["spec"]["nodeName"]
    pending["status"] = {"phase": "Pending"}
    echo = copy.deepcopy(pending)
    echo["spec"]["nodeName"] = "n7"
    echo["metadata"]["annotations"]["lattice.dev/devices"] = '{"gpus":[1]}'
    echo["metadata"]["resourceVersion"] = "99"
    echo["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    # kwok (or a kubelet) may have run it before the echo is read: states, no resources.
    echo["status"]["containerStatuses"] = [{"name": "c", "ready": True, "state": {"running": {}}}]
    expected = bound_fingerprint(
        pending, node="n7", annotations={"lattice.dev/devices": '{"gpus":[1]}'}
    )
    assert pod_fingerprint(echo) == expected
    assert pod_fingerprint(pending) != expected
    echo["metadata"]["labels"] = {"app": "changed-meanwhile"}
    assert pod_fingerprint(echo) != expected


def base_node() -> dict[str, Any]:
    return {
        "metadata": {"uid": "n", "name": "n1", "labels": {"zone": "a"}, "resourceVersion": "1"},
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}],
            "images": [],
        },
    }


NODE_SAME = {
    "heartbeat": _set("status.conditions.0.lastHeartbeatTime", "2026-01-01T00:00:10Z"),
    "resourceVersion": _set("metadata.resourceVersion", "2"),
    "images": _set("status.images", [{"names": ["x"]}]),
    "nodeInfo": _set("status.nodeInfo", {"kubeletVersion": "v1.34.4"}),
    "annotation": _set("metadata.annotations", {"a": "b"}),
}
NODE_DIFFERENT = {
    "uid": _set("metadata.uid", "m"),
    "name": _set("metadata.name", "n2"),
    "labels": _set("metadata.labels.zone", "b"),
    "taints": _set("spec.taints", []),
    "unschedulable": _set("spec.unschedulable", True),
    "allocatable": _set("status.allocatable.cpu", "3"),
    "capacity": _set("status.capacity.cpu", "8"),
    "declaredFeatures": _set("status.declaredFeatures", ["VolumeBindMountOptions"]),
}


@pytest.mark.parametrize("change", NODE_SAME.values(), ids=NODE_SAME.keys())
def test_node_fingerprint_ignores_heartbeats(change: Callable[[dict[str, Any]], None]) -> None:
    body = copy.deepcopy(base_node())
    change(body)
    assert node_fingerprint(body) == node_fingerprint(base_node())


@pytest.mark.parametrize("change", NODE_DIFFERENT.values(), ids=NODE_DIFFERENT.keys())
def test_node_fingerprint_sees_what_scheduling_reads(
    change: Callable[[dict[str, Any]], None],
) -> None:
    body = copy.deepcopy(base_node())
    change(body)
    assert node_fingerprint(body) != node_fingerprint(base_node())


# -- slimming -----------------------------------------------------------------------------


def full_pod() -> dict[str, Any]:
    """A pod as the API server sends it: what slimming drops, and what it must keep."""
    body = base_pod()
    body["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    body["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "{}"
    body["spec"]["containers"][0].update(
        env=[{"name": "A", "value": "b"}],
        command=["sh"],
        livenessProbe={"exec": {}},
        volumeMounts=[{"name": "v", "mountPath": "/data"}],
    )
    body["spec"]["initContainers"][0]["restartPolicy"] = "Always"
    body["status"].update(
        podIP="10.0.0.1",
        startTime="2026-01-01T00:00:00Z",
        nominatedNodeName="n2",
        qosClass="Burstable",
    )
    body["status"]["conditions"] += [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "m"},
        {"type": "PodResizePending", "reason": "Infeasible"},
        {"type": "DisruptionTarget", "status": "True"},
    ]
    body["status"]["containerStatuses"][0].update(
        resources={"requests": {"cpu": "200m"}},
        allocatedResources={"cpu": "200m"},
        state={"running": {"startedAt": "2026-01-01T00:00:01Z"}},
    )
    return body


SLIM_CASES = {"full": lambda b: None, **POD_SAME, **POD_DIFFERENT}


@pytest.mark.parametrize("change", SLIM_CASES.values(), ids=SLIM_CASES.keys())
def test_slimming_a_pod_keeps_everything_a_decision_reads(
    change: Callable[[dict[str, Any]], None],
) -> None:
    body = full_pod()
    change(body)
    slim = copy.deepcopy(body)
    slim_pod(cast(RawObject, slim))
    assert pod_fingerprint(slim) == pod_fingerprint(body)
    ours = {
        k: v for k, v in body["metadata"]["annotations"].items() if k.startswith("lattice.dev/")
    }
    assert parsed(slim) == parsed({**body, "metadata": {**body["metadata"], "annotations": ours}})


def parsed(body: dict[str, Any]) -> Pod | str:
    """The pod, or the error a bad one gets (which slimming must not change either)."""
    try:
        return Pod.from_api(body)
    except InvalidObjectError as exc:
        return str(exc)


def test_slimming_a_pod_drops_the_bulk_and_keeps_what_the_writers_read() -> None:
    slim = full_pod()
    slim_pod(cast(RawObject, slim))
    meta, container, status = slim["metadata"], slim["spec"]["containers"][0], slim["status"]
    assert "managedFields" not in meta
    assert set(meta["annotations"]) == {"lattice.dev/devices"}
    assert set(container) == {"name", "resources", "ports"}
    assert set(status) == {
        "phase",
        "conditions",
        "containerStatuses",
        "startTime",
        "nominatedNodeName",
    }
    assert [c["type"] for c in status["conditions"]] == [
        "PodScheduled",
        "PodResizePending",
        "DisruptionTarget",
    ]
    assert status["conditions"][0]["message"] == "m"  # the reporter's memory of PodScheduled
    assert status["containerStatuses"] == [
        {
            "name": "c",
            "resources": {"requests": {"cpu": "200m"}},
            "allocatedResources": {"cpu": "200m"},
        }
    ]


@pytest.mark.parametrize("change", [lambda b: None, *NODE_SAME.values(), *NODE_DIFFERENT.values()])
def test_slimming_a_node_keeps_what_scheduling_reads(
    change: Callable[[dict[str, Any]], None],
) -> None:
    body = copy.deepcopy(base_node())
    body["metadata"]["managedFields"] = [{"manager": "kubelet"}]
    body["status"]["nodeInfo"] = {"kubeletVersion": "v1.34.4"}
    change(body)
    slim = copy.deepcopy(body)
    slim_node(cast(RawObject, slim))
    assert node_fingerprint(slim) == node_fingerprint(body)
    assert Node.from_api(slim) == Node.from_api(body)
    assert set(slim["status"]) <= {"allocatable", "capacity", "declaredFeatures"}
    assert "managedFields" not in slim["metadata"]


async def test_listed_pods_arrive_slimmed_and_watched_ones_whole() -> None:
    hold = asyncio.Event()
    listed, watched = full_pod(), full_pod()
    watched["metadata"]["uid"] = "u2"

    def script(q: dict[str, str]) -> FakeResponse:
        if q.get("watch"):
            content = FakeContent([line("ADDED", watched)], hold=hold)
            return FakeResponse(200, content=content)
        return list_page([cast(RawObject, listed)], rv="10")

    api = FakeApi(script)
    async with Intake(
        cast(client.ApiClient, api), [pending_pods("lattice")], settings=FAST
    ) as intake:
        got = await collect(intake, lambda g: bool(batches(g)))
        hold.set()
    (initial,) = relists(got)
    item = initial.items[0]
    assert "managedFields" not in item["metadata"]
    assert "podIP" not in item["status"]
    assert pod_fingerprint(item) == pod_fingerprint(full_pod())
    assert batches(got)[0].events[0].obj == watched  # most events only meet a fingerprint


# -- the tracker --------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_pending_delete_only_dequeues_whichever_stream_comes_first() -> None:
    bound_first = PodTracker()
    bound_first.bound("u")  # the assigned stream's ADDED arrived first
    assert bound_first.pending(ev(D, "u")) is PendingVerdict.LEFT
    pending_first = PodTracker()
    assert pending_first.pending(ev(D, "u")) is PendingVerdict.LEFT  # then ADDED: places it


def test_lagging_pending_events_of_a_bound_pod_are_stale() -> None:
    tracker = PodTracker()
    assert tracker.pending(ev(A, "u")) is PendingVerdict.UPSERT
    tracker.bound("u")  # our binding succeeded (or the assigned stream showed it)
    assert tracker.pending(ev(M, "u")) is PendingVerdict.STALE
    assert tracker.pending(ev(M, "other")) is PendingVerdict.UPSERT


def test_tombstone_lasts_until_the_pending_stream_passes_it() -> None:
    clock = Clock()
    tracker = PodTracker(ttl=60, clock=clock)
    tracker.bound("u")
    tracker.gone("u", "50")  # deleted while the pending stream lags at RV 40
    tracker.pending_progress("40")
    assert tracker.pending(ev(M, "u", 30)) is PendingVerdict.STALE
    tracker.pending_progress("50")
    assert tracker.tombstones == 0
    assert tracker.pending(ev(A, "u")) is PendingVerdict.UPSERT


def test_tombstone_expires_after_ttl_without_integer_rvs() -> None:
    clock = Clock()
    tracker = PodTracker(ttl=60, clock=clock)
    tracker.bound("u")
    tracker.gone("u", "not-a-number")
    tracker.pending_progress("also-not")
    assert tracker.is_bound("u")
    clock.now = 61
    assert not tracker.is_bound("u")


def test_assigned_relist_tombstones_pods_that_left_during_the_gap() -> None:
    tracker = PodTracker()
    tracker.bound("a")
    tracker.bound("b")
    tracker.relisted(["b", "c"], "100")
    assert tracker.pending(ev(M, "a")) is PendingVerdict.STALE  # tombstoned, not forgotten
    assert tracker.tombstones == 1
    assert tracker.is_bound("c")
    tracker.pending_progress("100")
    assert not tracker.is_bound("a")


def test_slimming_keeps_only_the_mounts_with_bind_options() -> None:
    body = full_pod()
    body["spec"]["containers"][0]["volumeMounts"].append(BIND_MOUNT)
    body["spec"]["containers"][0]["restartPolicyRules"] = [{"action": "RestartAllContainers"}]
    slim = copy.deepcopy(body)
    slim_pod(cast(RawObject, slim))
    container = slim["spec"]["containers"][0]
    assert container["volumeMounts"] == [BIND_MOUNT]
    assert container["restartPolicyRules"] == [{"action": "RestartAllContainers"}]
    assert pod_fingerprint(slim) == pod_fingerprint(body)
    assert Pod.from_api(slim).required_features == {
        "RestartAllContainersOnContainerExits",
        "VolumeBindMountOptions",
    }


def test_a_node_declaring_a_feature_is_not_a_heartbeat() -> None:
    body = base_node()
    body["status"]["declaredFeatures"] = ["RestartAllContainersOnContainerExits"]
    slim = copy.deepcopy(body)
    slim_node(cast(RawObject, slim))
    assert slim["status"]["declaredFeatures"] == ["RestartAllContainersOnContainerExits"]
    assert Node.from_api(slim).declared_features == {"RestartAllContainersOnContainerExits"}
    assert node_fingerprint(body) != node_fingerprint(base_node())

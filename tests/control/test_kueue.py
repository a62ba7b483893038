"""``spec.topology.fromKueue``: a Kueue Topology's levels, read and followed against a
scripted API server (discovery, the object's list and watch), and applied to the
scheduler as a change of ``spec.topology.levels`` is."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import orjson
import pytest
from kubernetes_asyncio import client

from scheduler.config import RunConfig
from scheduler.control.app import App
from scheduler.control.kueue import (
    KueueTopologies,
    Reason,
    Resolution,
    read_once,
    resolve,
    topology_levels,
    version_priority,
)
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import SettingsError, parse_spec
from scheduler.control.status import build_status
from scheduler.obs.metrics import Metrics
from tests.control.test_gangs import podgroup
from tests.control.test_intake import (
    FAST,
    FakeApi,
    FakeContent,
    FakeResponse,
    line,
    list_page,
    status,
)

pytestmark = pytest.mark.usefixtures("no_leaked_tasks")

BLOCK, RACK, HOST = "example.com/block", "example.com/rack", "kubernetes.io/hostname"


def topology(name: str, *labels: str, uid: str = "") -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Topology",
        "metadata": {"name": name, "uid": uid or f"uid-{name}-{len(labels)}"},
        "spec": {"levels": [{"nodeLabel": label} for label in labels]},
    }


# -- pure parts ---------------------------------------------------------------------------


def test_versions_sort_as_kubernetes_orders_them() -> None:
    served = ["v1alpha1", "v1beta1", "v1", "v1beta2", "v2alpha1", "unknown"]
    ordered = sorted(served, key=version_priority, reverse=True)
    assert ordered == ["v1", "v1beta2", "v1beta1", "v2alpha1", "v1alpha1", "unknown"]


def test_a_topologys_node_labels_are_its_levels_widest_first() -> None:
    assert topology_levels(topology("t", BLOCK, RACK, HOST)) == (BLOCK, RACK, HOST)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param({}, "no levels", id="none"),
        pytest.param({"levels": []}, "no levels", id="empty"),
        pytest.param({"levels": [{"label": RACK}]}, r"levels\[0\].*no nodeLabel", id="field"),
        pytest.param({"levels": [{"nodeLabel": "a b"}]}, "is not a label key", id="key"),
        pytest.param(
            {"levels": [{"nodeLabel": RACK}, {"nodeLabel": RACK}]}, "listed twice", id="twice"
        ),
        pytest.param(  # Kueue's v1beta2 allows 16; Lattice's objective holds 8
            {"levels": [{"nodeLabel": f"example.com/l{i}"} for i in range(12)]},
            "12 levels, at most 8",
            id="many",
        ),
    ],
)
def test_levels_lattice_cannot_use_say_why(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        topology_levels({"spec": spec})


def test_resolution_says_where_the_levels_come_from_or_why_there_are_none() -> None:
    read = resolve("net", "v1beta2", topology("net", BLOCK, RACK))
    assert (read.reason, read.levels) == (Reason.READ, (BLOCK, RACK))
    assert read.message == (
        f"levels from Kueue Topology net (kueue.x-k8s.io/v1beta2): {BLOCK}, {RACK}"
    )
    gone = resolve("net", "v1beta2", None)
    assert (gone.reason, gone.levels) == (Reason.NOT_FOUND, ())
    assert "does not exist" in gone.message
    bad = resolve("net", "v1beta1", {"spec": {"levels": [{"nodeLabel": "a b"}]}})
    assert (bad.reason, bad.levels) == (Reason.INVALID, ())
    assert "is not usable: spec.levels[0]: 'a b'" in bad.message


# -- following the object -----------------------------------------------------------------


class Kueue:
    """A scripted API server's side of Kueue: discovery of ``kueue.x-k8s.io`` (404 until
    :attr:`served`), and the list and watches of Topology ``net``."""

    def __init__(self, *items: dict[str, Any]) -> None:
        self.served = False
        self.items = list(items)
        self.watches: list[FakeContent] = []
        """One per watch request, in order; when they run out, a watch that idles."""
        self.paths: list[str] = []

    def __call__(self, q: dict[str, str]) -> FakeResponse:
        path = q["path"]
        self.paths.append(path)
        group = "/apis/kueue.x-k8s.io"
        if path == group:
            if not self.served:
                return FakeResponse(404, status(404))
            versions = [{"version": v} for v in ("v1beta1", "v1beta2")]
            return FakeResponse(200, orjson.dumps({"name": "kueue.x-k8s.io", "versions": versions}))
        if path in (f"{group}/v1beta1", f"{group}/v1beta2"):
            names = ["topologies", "clusterqueues"]
            return FakeResponse(200, orjson.dumps({"resources": [{"name": n} for n in names]}))
        if path == f"{group}/v1beta2/topologies/net":  # a read by name
            found = [i for i in self.items if i["metadata"]["name"] == "net"]
            return FakeResponse(200, orjson.dumps(found[0])) if found else FakeResponse(404)
        assert path == f"{group}/v1beta2/topologies", path  # the newest served version
        assert q["fieldSelector"] == "metadata.name=net"
        if q.get("watch"):
            watch = self.watches.pop(0) if self.watches else FakeContent([], asyncio.Event())
            return FakeResponse(200, content=watch)
        return list_page(cast(Any, self.items), rv="10")


async def until(predicate: Callable[[], bool], within: float = 5.0) -> None:
    for _ in range(int(within / 0.005)):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"not true within {within}s")


async def test_a_topology_is_followed_from_not_served_to_read_to_gone_to_re_created() -> None:
    kueue = Kueue(topology("net", BLOCK, HOST))
    deleted, later = asyncio.Event(), asyncio.Event()
    kueue.watches = [
        FakeContent([line("DELETED", topology("net", BLOCK, HOST))], hold=deleted),
        FakeContent([line("ADDED", topology("net", BLOCK, RACK, HOST))], hold=later),
    ]
    seen: list[Resolution] = []
    follower = KueueTopologies(
        cast(client.ApiClient, FakeApi(kueue)), seen.append, retry_s=0.01, intake_settings=FAST
    )
    follower.follow("net")
    assert follower.resolution is not None
    assert follower.resolution.reason is Reason.PENDING
    try:
        await until(lambda: bool(seen))
        assert seen[0].reason is Reason.NOT_SERVED
        assert "does not serve topologies.kueue.x-k8s.io" in seen[0].message
        kueue.served = True  # Kueue installed: found at the next discovery
        # Kueue's levels are immutable: a change is a delete and a re-create, which the
        # watch shows as both (the first watch shows the delete at once).
        await until(lambda: seen[-1].reason is Reason.NOT_FOUND)
        reasons = [r.reason for r in seen]
        assert reasons == [Reason.NOT_SERVED, Reason.READ, Reason.NOT_FOUND]  # once each
        assert [r.levels for r in seen] == [(), (BLOCK, HOST), ()]
        deleted.set()
        await until(lambda: seen[-1].reason is Reason.READ)
        assert seen[-1].levels == (BLOCK, RACK, HOST)
        assert follower.resolution == seen[-1]
    finally:
        later.set()
        await follower.close()


async def test_following_nothing_stops_and_reads_nothing() -> None:
    kueue = Kueue(topology("net", BLOCK))
    kueue.served = True
    seen: list[Resolution] = []
    follower = KueueTopologies(
        cast(client.ApiClient, FakeApi(kueue)), seen.append, retry_s=0.01, intake_settings=FAST
    )
    follower.follow(None)
    assert follower.resolution is None
    await asyncio.sleep(0.05)
    assert kueue.paths == []
    follower.follow("net")
    await follower.wait_read()
    follower.follow(None)
    assert follower.resolution is None
    asked = len(kueue.paths)
    await asyncio.sleep(0.05)
    assert len(kueue.paths) == asked
    assert [r.levels for r in seen] == [(BLOCK,)]
    await follower.close()


async def test_explain_reads_the_topology_once() -> None:
    kueue = Kueue()
    api = cast(client.ApiClient, FakeApi(kueue))
    assert (await read_once(api, "net")).reason is Reason.NOT_SERVED
    kueue.served = True
    assert (await read_once(api, "net")).reason is Reason.NOT_FOUND
    kueue.items = [topology("net", BLOCK, RACK)]
    assert (await read_once(api, "net")).levels == (BLOCK, RACK)


# -- applied to the scheduler ---------------------------------------------------------------


def app_following(kueue: Kueue, spec: dict[str, Any]) -> App:
    app = App(RunConfig())
    app.scheduler = Scheduler(parse_spec({}, "lattice"), writer=None, metrics=Metrics.create())
    app.kueue = KueueTopologies(
        cast(client.ApiClient, FakeApi(kueue)), app._on_kueue, retry_s=0.01, intake_settings=FAST
    )
    app._apply_object({"metadata": {"name": "lattice"}, "spec": spec})
    return app


def condition(app: App) -> dict[str, Any]:
    status = build_status(
        app.scheduler,
        leader="me",
        ready=True,
        settings_error=app.settings_error,
        generation=1,
        kueue=app.kueue.resolution if app.kueue is not None else None,
    )
    found: list[dict[str, Any]] = [
        c for c in status["conditions"] if c["type"] == "TopologyResolved"
    ]
    assert len(found) == 1
    return found[0]


async def test_kueue_levels_are_applied_live_and_re_read_refused_podgroups() -> None:
    """A PodGroup whose slice level the Topology lacks is refused, and read again when the
    re-created Topology has it; the status says where the levels come from."""
    kueue = Kueue(topology("net", BLOCK, HOST))
    kueue.served = True
    delete, deleted, later = asyncio.Event(), asyncio.Event(), asyncio.Event()
    kueue.watches = [
        FakeContent([], hold=delete),
        FakeContent([line("DELETED", topology("net", BLOCK, HOST))], hold=deleted),
        FakeContent([line("ADDED", topology("net", BLOCK, RACK, HOST))], hold=later),
    ]
    app = app_following(kueue, {"topology": {"fromKueue": "net"}})
    assert app.kueue is not None
    sched = app.scheduler
    try:
        assert not sched.settings.topology.levels
        assert condition(app)["reason"] == "KueueTopologyPending"
        await until(lambda: sched.settings.topology.levels == (BLOCK, HOST))
        assert sched.settings.topology.from_kueue == "net"
        cond = condition(app)
        assert (cond["status"], cond["reason"]) == ("True", "KueueTopologyRead")
        sliced = {
            "lattice.dev/topology-slice-size": "2",
            "lattice.dev/topology-slice-required": RACK,
        }
        sched.podgroup_upserted(podgroup("g", 4, **sliced))
        gang = sched.gang_flow.gangs.get("default/g")
        assert gang is not None
        assert gang.spec is None
        assert (
            f"must be one of the levels of Kueue Topology net ({BLOCK}, {HOST})"
            in gang.waiting_message()
        )
        delete.set()
        await until(lambda: sched.settings.topology.levels == ())
        cond = condition(app)
        assert (cond["status"], cond["reason"]) == ("False", "KueueTopologyNotFound")
        deleted.set()
        await until(lambda: sched.settings.topology.levels == (BLOCK, RACK, HOST))
        again = sched.gang_flow.gangs.get("default/g")
        assert again is not None
        assert again.spec is not None
        assert again.spec.slice_key == RACK
        # The same spec applied again (kopf re-delivers it) keeps the Kueue levels.
        app._apply_object(
            {"metadata": {"name": "lattice"}, "spec": {"topology": {"fromKueue": "net"}}}
        )
        assert list(sched.settings.topology.levels) == [BLOCK, RACK, HOST]
        # Back to spec levels: the follower stops, the condition says so.
        app._apply_object(
            {"metadata": {"name": "lattice"}, "spec": {"topology": {"levels": [RACK]}}}
        )
        assert app.kueue.name is None
        assert sched.settings.topology.levels == (RACK,)
        cond = condition(app)
        assert (cond["status"], cond["reason"]) == ("True", "SpecLevels")
        assert cond["message"] == f"levels from spec.topology.levels: {RACK}"
    finally:
        for event in (delete, deleted, later):
            event.set()
        await app.kueue.close()


async def test_both_levels_and_from_kueue_keep_the_settings_in_force() -> None:
    kueue = Kueue()
    app = app_following(kueue, {"topology": {"levels": [RACK]}})
    app._apply_object(
        {
            "metadata": {"name": "lattice"},
            "spec": {"topology": {"levels": [RACK], "fromKueue": "net"}},
        }
    )
    assert app.settings_error is not None
    assert "levels and fromKueue are both set" in app.settings_error
    assert app.scheduler.settings.topology.levels == (RACK,)
    assert app.kueue is not None
    assert app.kueue.name is None  # nothing followed for a spec not in force
    await app.kueue.close()

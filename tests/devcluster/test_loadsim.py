"""Simulated load agents against a fake TopologyApi and a fake pod list (no control plane)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from lattice_dev.devcluster.loadsim import (
    USAGE_RATIO_ANNOTATION,
    LoadSimSettings,
    SimulatedLoadAgents,
    bound_pod,
    capacity_of,
    minimal_topology,
)
from lattice_dev.predict.synthetic import GIB, SyntheticLoad, SyntheticNode
from scheduler.agent.publisher import ConflictError
from scheduler.model.topology import NodeTopology, NodeTopologyStatus

T0 = 1_750_000_000.0  # Unix seconds: the agents' clock


class FakeTopologyApi:
    """Stores objects in a dict; counts calls and the most status writes in flight at once."""

    def __init__(self, objects: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.objects: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (objects or {}).items()}
        self.calls: list[tuple[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.fail_status: set[str] = set()

    async def get(self, name: str) -> Mapping[str, Any] | None:
        self.calls.append(("get", name))
        return self.objects.get(name)

    async def create(self, body: Mapping[str, Any]) -> None:
        name = body["metadata"]["name"]
        self.calls.append(("create", name))
        if name in self.objects:
            raise ConflictError(name)
        self.objects[name] = copy.deepcopy(dict(body))

    async def replace_spec(self, name: str, spec: Mapping[str, Any]) -> None:
        self.calls.append(("replace_spec", name))
        self.objects[name]["spec"] = spec

    async def replace_status(self, name: str, status: Mapping[str, Any]) -> None:
        self.calls.append(("replace_status", name))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            if name in self.fail_status:
                raise RuntimeError("boom")
            if name not in self.objects:
                raise RuntimeError("404")
            self.objects[name]["status"] = copy.deepcopy(dict(status))
        finally:
            self.in_flight -= 1

    async def node_uid(self, name: str) -> str | None:
        return f"uid-{name}"

    def count(self, verb: str) -> int:
        return sum(1 for v, _ in self.calls if v == verb)


class FakeSource:
    def __init__(self, capacities: Mapping[str, tuple[int, int]] | None = None) -> None:
        self.pods: list[dict[str, Any]] = []
        self.capacities = dict(capacities or {})
        self.lists = 0

    async def bound_pods(self) -> Sequence[Mapping[str, Any]]:
        self.lists += 1
        return list(self.pods)

    async def node_capacity(self, name: str) -> tuple[int, int] | None:
        return self.capacities.get(name)


def pod(
    name: str,
    node: str,
    cpu: str = "500m",
    mem: str = "1Gi",
    *,
    scheduled: str | None = None,
    phase: str = "Running",
    deleting: bool = False,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}"}
    if annotations:
        metadata["annotations"] = annotations
    if deleting:
        metadata["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    status: dict[str, Any] = {"phase": phase}
    if scheduled is not None:
        status["conditions"] = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled}
        ]
    return {
        "metadata": metadata,
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": mem}}}],
        },
        "status": status,
    }


def fleet(*names: str, base: float = 0.2) -> SyntheticLoad:
    return SyntheticLoad(
        [SyntheticNode(name=n, base_cpu=base, noise_cpu=0.0, noise_memory=0.0) for n in names],
        seed=1,
    )


def agents(
    api: FakeTopologyApi, source: FakeSource, load: SyntheticLoad, **settings: Any
) -> SimulatedLoadAgents:
    clock = {"t": T0}
    return SimulatedLoadAgents(
        api,
        source,
        load,
        settings=LoadSimSettings(**{"warmup_s": 10.0, "interval_s": 5.0, **settings}),
        clock=lambda: clock["t"],
    )


def status_of(api: FakeTopologyApi, name: str) -> NodeTopologyStatus:
    return NodeTopologyStatus.from_status(api.objects[name]["status"])


async def test_creates_a_minimal_spec_from_the_node_only_when_absent() -> None:
    gpu_spec = minimal_topology(96_000, 1024 * GIB).to_spec()
    api = FakeTopologyApi({"b": {"metadata": {"name": "b"}, "spec": gpu_spec}})
    source = FakeSource({"a": (4000, 16 * GIB)})
    sim = agents(api, source, fleet("a", "b"))

    first = await sim.round(T0)
    assert (first.published, first.failed, first.created) == (2, 0, 1)
    made = api.objects["a"]
    assert made["metadata"]["ownerReferences"][0]["uid"] == "uid-a"
    topo = NodeTopology.from_spec(made["spec"])
    assert [n.cpulist for n in topo.numa_nodes] == ["0-3"]
    assert topo.numa_nodes[0].memory_bytes == 16 * GIB
    assert topo.pcie.devices == ()
    assert api.objects["b"]["spec"] == gpu_spec  # an existing spec is kept
    assert api.count("replace_spec") == 0

    api.calls.clear()
    await sim.round(T0 + 5)
    assert api.count("get") == 0  # the spec is checked once per node
    assert api.count("create") == 0
    assert api.count("replace_status") == 2


def test_minimal_topology_rounds_cpus_up() -> None:
    assert minimal_topology(3500, GIB).numa_nodes[0].cpulist == "0-3"
    assert capacity_of({"cpu": "32", "memory": "128Gi"}) == (32_000, 128 * GIB)
    assert capacity_of({"cpu": "4"}) is None


async def test_status_load_rises_with_the_pods_on_the_node() -> None:
    load = fleet("a", "b")
    api, source = FakeTopologyApi(), FakeSource()
    sim = agents(api, source, load)
    await sim.round(T0)
    idle = status_of(api, "a").load
    assert idle is not None
    assert idle.cpu_used_milli == 800  # base 0.2 of 4000m, no noise

    source.pods = [
        pod("p1", "a"),
        pod("p2", "a"),
        pod("p3", "a", annotations={USAGE_RATIO_ANNOTATION: "2.0"}),
        pod("gone", "a", deleting=True),
        pod("done", "a", phase="Succeeded"),
        pod("elsewhere", "not-simulated"),
    ]
    await sim.round(T0 + 1)  # first seen: started now, nothing warm yet
    assert status_of(api, "a").load.cpu_used_milli == 800  # type: ignore[union-attr]
    await sim.round(T0 + 6)  # half way through the 10 s warm-up
    assert status_of(api, "a").load.cpu_used_milli == 800 + 1000  # type: ignore[union-attr]
    await sim.round(T0 + 20)
    busy = status_of(api, "a")
    assert busy.load is not None
    assert busy.load.cpu_used_milli == 800 + 500 + 500 + 1000
    assert busy.load.sample_time.timestamp() == pytest.approx(T0 + 20)
    assert busy.last_report_time.timestamp() == pytest.approx(T0 + 20, abs=1)
    assert busy.pressure is not None
    assert busy.pressure.cpu is not None
    assert status_of(api, "b").load.cpu_used_milli == 800  # type: ignore[union-attr]

    truth = sim.truth("a")
    assert truth is not None
    assert truth.cpu_used_milli == 2800
    assert [r.sample_time for r in sim.history("a")] == [T0, T0 + 1, T0 + 6, T0 + 20]
    assert len(sim.pods_on("a")) == 3


async def test_pod_scheduled_time_starts_the_warm_up() -> None:
    api, source = FakeTopologyApi(), FakeSource()
    sim = agents(api, source, fleet("a"))
    source.pods = [pod("p", "a", cpu="1", scheduled="2025-06-15T15:06:40Z")]
    scheduled = 1_750_000_000.0  # 2025-06-15T15:06:40Z
    await sim.round(scheduled + 5)
    assert sim.truth("a").cpu_used_milli == 800 + 500  # type: ignore[union-attr]


async def test_hot_node_shows_cpu_pressure() -> None:
    api, source = FakeTopologyApi(), FakeSource()
    sim = agents(api, source, fleet("a", base=1.1))
    await sim.round(T0)
    status = status_of(api, "a")
    assert status.load is not None
    assert status.load.cpu_used_milli == 4000  # use is clipped
    assert status.pressure is not None
    assert status.pressure.cpu is not None
    assert status.pressure.cpu.some.avg10 == pytest.approx(75.0)


async def test_publishing_is_bounded_and_a_failure_rechecks_the_spec() -> None:
    names = [f"n{i:03d}" for i in range(100)]
    api, source = FakeTopologyApi(), FakeSource()
    sim = agents(api, source, fleet(*names), parallel=4)
    result = await sim.round(T0)
    assert result.published == 100
    assert api.max_in_flight == 4
    assert source.lists == 1  # one pod list per round

    api.fail_status = {"n007"}
    result = await sim.round(T0 + 5)
    assert (result.published, result.failed) == (99, 1)
    assert len(sim.history("n007")) == 1  # only published samples are history
    assert sim.truth("n007").sample_time == T0 + 5  # type: ignore[union-attr]

    api.fail_status = set()
    api.calls.clear()
    await sim.round(T0 + 10)
    assert api.calls.count(("get", "n007")) == 1
    assert api.count("get") == 1


async def test_a_failed_pod_list_keeps_the_last_pods() -> None:
    class Broken(FakeSource):
        async def bound_pods(self) -> Sequence[Mapping[str, Any]]:
            raise RuntimeError("apiserver away")

    api, source = FakeTopologyApi(), FakeSource()
    sim = agents(api, source, fleet("a"), warmup_s=0.0)
    source.pods = [pod("p", "a", cpu="1")]
    await sim.round(T0)
    sim._source = Broken()
    await sim.round(T0 + 5)
    assert sim.truth("a").cpu_used_milli == 1800  # type: ignore[union-attr]


async def test_run_rounds_until_stopped_and_next_round_waits() -> None:
    api, source = FakeTopologyApi(), FakeSource()
    sim = SimulatedLoadAgents(api, source, fleet("a"), settings=LoadSimSettings(interval_s=0.01))
    stop = asyncio.Event()
    task = asyncio.create_task(sim.run(stop))
    await sim.next_round()
    second = await sim.next_round()
    stop.set()
    await task
    assert sim.rounds >= 2
    assert second.published == 1


def test_replace_load_needs_every_node() -> None:
    sim = agents(FakeTopologyApi(), FakeSource(), fleet("a", "b"))
    with pytest.raises(ValueError, match="lacks"):
        sim.replace_load(fleet("a"))
    sim.replace_load(fleet("a", "b", "c"))
    with pytest.raises(ValueError, match="without a synthetic model"):
        SimulatedLoadAgents(FakeTopologyApi(), FakeSource(), fleet("a"), nodes=["a", "z"])


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(pod("p", "n"), (500, GIB, None), id="running"),
        pytest.param(
            pod("p", "n", annotations={USAGE_RATIO_ANNOTATION: "1.5"}), (500, GIB, 1.5), id="ratio"
        ),
        pytest.param(
            pod("p", "n", annotations={USAGE_RATIO_ANNOTATION: "lots"}),
            (500, GIB, None),
            id="bad-ratio-ignored",
        ),
        pytest.param(pod("p", "n", deleting=True), None, id="terminating"),
        pytest.param(pod("p", "n", phase="Failed"), None, id="failed"),
        pytest.param(pod("p", ""), None, id="unbound"),
        pytest.param({"metadata": "nonsense"}, None, id="unparsable"),
    ],
)
def test_bound_pod(body: dict[str, Any], expected: tuple[int, int, float | None] | None) -> None:
    got = bound_pod(body)
    if expected is None:
        assert got is None
    else:
        assert got is not None
        assert (got.cpu_request_milli, got.mem_request_bytes, got.usage_ratio) == expected
        assert got.key == "uid-p"


async def test_pods_are_parsed_again_only_when_their_resource_version_changes() -> None:
    api, source = FakeTopologyApi(), FakeSource()
    sim = agents(api, source, fleet("a"), warmup_s=0.0)
    body = pod("p", "a", cpu="1")
    body["metadata"]["resourceVersion"] = "1"
    source.pods = [body]
    await sim.round(T0)
    assert sim.truth("a").cpu_used_milli == 1800  # type: ignore[union-attr]

    stale = copy.deepcopy(body)
    stale["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"  # same version: cached
    source.pods = [stale]
    await sim.round(T0 + 5)
    assert sim.truth("a").cpu_used_milli == 1800  # type: ignore[union-attr]

    deleting = pod("p", "a", cpu="1", deleting=True)
    deleting["metadata"]["resourceVersion"] = "2"
    source.pods = [deleting]
    await sim.round(T0 + 10)
    assert sim.truth("a").cpu_used_milli == 800  # type: ignore[union-attr]

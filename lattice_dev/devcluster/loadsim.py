"""Simulated load agents: NodeTopology ``status.load`` and PSI for fake (kwok) nodes.

A kwok node runs nothing, so its "real" load comes from a :class:`SyntheticLoad` model
(base load per node, noise, hotspots) plus the pods bound to it. Every ``interval_s`` one
round

1. lists the pods bound to any node (one ``list_pod_for_all_namespaces`` with
   ``spec.nodeName!=``), skipping terminating and finished (Succeeded/Failed) pods;
2. turns each into a :class:`PodLoad`: its requests as kube-scheduler accounts them
   (:meth:`Pod.from_api`), times a usage ratio (``settings.usage_ratio``, or per pod the
   annotation ``lattice.dev/sim-usage-ratio`` so a benchmark can make pods use more than
   they request), ramping in over ``settings.warmup_s`` from the pod's ``PodScheduled``
   time (or from when the simulator first saw it bound);
3. samples every node at one wall-clock time (Unix seconds, the clock the scheduler ages
   reports with) and publishes each node's status - ``load``, ``pressure`` (the sample's
   PSI as avg10, with avg60/avg300 decayed like the kernel's and a running total) and
   ``lastReportTime`` - with bounded concurrency (``settings.parallel`` calls in flight).

A node without a NodeTopology object (the standard and small profiles) gets one with a
minimal spec derived from its Node: one NUMA node with CPUs ``0..N-1`` (N = capacity cpu,
rounded up) and the Node's memory capacity, no PCIe devices. An existing object (gpu-8x
nodes, published by :mod:`lattice_dev.devcluster.agents`) keeps its spec: only the status is
written. The spec check is done once per node, and again after a failed write.

The simulator keeps, in process, the last sample of every node (:meth:`truth`: the "real"
load a benchmark judges placements against) and the series of published samples
(:meth:`history`: what a scheduler could have seen). It is pure apart from the two seams,
:class:`~scheduler.agent.publisher.TopologyApi` and :class:`ClusterSource`, which tests
replace with fakes. The NodeTopology CRD must be applied first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Protocol

import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from lattice_dev.predict.synthetic import PodLoad, SyntheticLoad
from scheduler.agent.publisher import ConflictError, KubernetesTopologyApi, TopologyApi
from scheduler.agent.resource import node_topology_object
from scheduler.model.names import CPU, MEMORY
from scheduler.model.pod import Pod
from scheduler.model.quantity import Quantity
from scheduler.model.topology import (
    LOCAL_NUMA_DISTANCE,
    NodeLoad,
    NodeTopology,
    NodeTopologyStatus,
    NumaNode,
    Pressure,
    PressureLine,
    PressureReadings,
    parse_time,
)
from scheduler.predict.types import LoadReport

USAGE_RATIO_ANNOTATION: Final = "lattice.dev/sim-usage-ratio"
"""Per-pod override of the usage ratio (a float >= 0, e.g. ``"1.5"``)."""

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadSimSettings:
    interval_s: float = 15.0
    """Time between rounds: the report interval of every simulated agent."""
    usage_ratio: float = 1.0
    """A pod uses this times its requests once warm, unless its annotation says otherwise."""
    warmup_s: float = 10.0
    """A pod's usage ramps in linearly over this long after it starts."""
    parallel: int = 32
    """Status writes (and spec checks) in flight at once."""
    history: int = 4096
    """Published samples kept per node for :meth:`SimulatedLoadAgents.history`."""

    def __post_init__(self) -> None:
        if not self.interval_s > 0 or self.parallel < 1 or self.history < 1:
            raise ValueError("need interval_s > 0, parallel >= 1, history >= 1")
        if not (self.usage_ratio >= 0 and self.warmup_s >= 0):
            raise ValueError("need usage_ratio >= 0 and warmup_s >= 0")


class ClusterSource(Protocol):
    """What the simulator reads from the cluster besides NodeTopology objects."""

    async def bound_pods(self) -> Sequence[Mapping[str, Any]]:
        """Raw bodies of the pods with a ``spec.nodeName`` (any namespace)."""
        ...

    async def node_capacity(self, name: str) -> tuple[int, int] | None:
        """(cpu millicores, memory bytes) of the Node's capacity; None if it cannot be read."""
        ...


class KubernetesClusterSource:
    """:class:`ClusterSource` over the core API (raw JSON, no model deserialisation)."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self._core = client.CoreV1Api(api_client)

    async def bound_pods(self) -> Sequence[Mapping[str, Any]]:
        resp: Any = await self._core.list_pod_for_all_namespaces(
            field_selector="spec.nodeName!=", _preload_content=False
        )
        items: list[Mapping[str, Any]] = json.loads(await resp.read())["items"]
        return items

    async def node_capacity(self, name: str) -> tuple[int, int] | None:
        try:
            resp: Any = await self._core.read_node(name, _preload_content=False)
        except ApiException as exc:
            log.warning("cannot read node capacity", node=name, error=exc.status)
            return None
        capacity = json.loads(await resp.read()).get("status", {}).get("capacity", {})
        return capacity_of(capacity)


def capacity_of(capacity: Mapping[str, Any]) -> tuple[int, int] | None:
    """(cpu millicores, memory bytes) from a Node's ``status.capacity``; None if absent."""
    try:
        cpu = Quantity.parse(capacity[CPU], field="capacity.cpu").milli_value()
        mem = Quantity.parse(capacity[MEMORY], field="capacity.memory").value()
    except (KeyError, ValueError):
        return None
    return (cpu, mem) if cpu > 0 and mem > 0 else None


def minimal_topology(cpu_milli: int, mem_bytes: int) -> NodeTopology:
    """One NUMA node holding all CPUs (capacity rounded up to whole CPUs) and all memory."""
    cpus = max(1, math.ceil(cpu_milli / 1000))
    return NodeTopology(
        numa_nodes=(
            NumaNode(
                id=0,
                cpus=frozenset(range(cpus)),
                memory_bytes=mem_bytes,
                distances=(LOCAL_NUMA_DISTANCE,),
            ),
        )
    )


@dataclass(frozen=True, slots=True)
class BoundPod:
    """What the simulator needs of one bound pod."""

    key: str
    node: str
    cpu_request_milli: int
    mem_request_bytes: int
    usage_ratio: float | None
    """From the annotation; None = the simulator's default."""
    scheduled_at: float | None
    """Unix time of the ``PodScheduled=True`` condition, when present."""


def bound_pod(body: Mapping[str, Any]) -> BoundPod | None:
    """A pod that uses its node's resources, or None (unbound, terminating, finished, bad)."""
    try:
        pod = Pod.from_api(body)
    except (ValueError, TypeError, KeyError):
        return None
    if not pod.node_name or pod.terminating or pod.phase in ("Succeeded", "Failed"):
        return None
    ratio: float | None = None
    raw = pod.annotations.get(USAGE_RATIO_ANNOTATION)
    if raw is not None:
        try:
            ratio = float(raw)
        except ValueError:
            ratio = None
        if ratio is not None and not (math.isfinite(ratio) and ratio >= 0):
            ratio = None
    scheduled_at: float | None = None
    status = body.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for cond in conditions if isinstance(conditions, list) else ():
        if (
            isinstance(cond, Mapping)
            and cond.get("type") == "PodScheduled"
            and cond.get("status") == "True"
            and isinstance(cond.get("lastTransitionTime"), str)
        ):
            with contextlib.suppress(ValueError):
                scheduled_at = parse_time(cond["lastTransitionTime"]).timestamp()
    return BoundPod(
        key=pod.key,
        node=pod.node_name,
        cpu_request_milli=pod.resources.accounted.get(CPU, 0),
        mem_request_bytes=pod.resources.accounted.get(MEMORY, 0),
        usage_ratio=ratio,
        scheduled_at=scheduled_at,
    )


@dataclass(slots=True)
class _Psi:
    """Kernel-like PSI averages of one line: avg10 is the sample, avg60/300 decay towards it."""

    avg60: float = 0.0
    avg300: float = 0.0
    total_us: int = 0

    def line(self, avg10: float, dt: float) -> PressureLine:
        if dt > 0:
            self.avg60 += (1.0 - math.exp(-dt / 60.0)) * (avg10 - self.avg60)
            self.avg300 += (1.0 - math.exp(-dt / 300.0)) * (avg10 - self.avg300)
            self.total_us += round(avg10 / 100.0 * dt * 1e6)
        return PressureLine(
            avg10=round(avg10, 2),
            avg60=round(self.avg60, 2),
            avg300=round(self.avg300, 2),
            total_us=self.total_us,
        )


@dataclass(slots=True)
class PsiState:
    """One node's PSI lines between reports."""

    cpu: _Psi = field(default_factory=_Psi)
    memory_some: _Psi = field(default_factory=_Psi)
    memory_full: _Psi = field(default_factory=_Psi)
    last: float | None = None


def node_status(
    report: LoadReport, window_s: float, psi: PsiState | None = None
) -> NodeTopologyStatus:
    """The NodeTopology status an agent would write for one sample."""
    stamp = datetime.fromtimestamp(report.sample_time, UTC)
    state = psi if psi is not None else PsiState()
    dt = window_s if state.last is None else max(report.sample_time - state.last, 0.0)
    state.last = report.sample_time
    pressure = PressureReadings(
        cpu=Pressure(some=state.cpu.line(report.psi.cpu_some, dt)),
        memory=Pressure(
            some=state.memory_some.line(report.psi.memory_some, dt),
            full=state.memory_full.line(report.psi.memory_full, dt),
        ),
    )
    load = NodeLoad(
        sample_time=stamp,
        window_seconds=window_s,
        samples=1,
        cpu_used_milli=round(report.cpu_used_milli),
        cpu_capacity_milli=report.cpu_capacity_milli,
        mem_used_bytes=round(report.mem_used_bytes),
        mem_capacity_bytes=report.mem_capacity_bytes,
    )
    return NodeTopologyStatus(last_report_time=stamp, pressure=pressure, load=load)


@dataclass(frozen=True, slots=True)
class RoundResult:
    time: float
    """Sample time of the round (Unix seconds)."""
    published: int
    failed: int
    created: int
    """NodeTopology objects created this round (minimal specs)."""
    pods: int
    """Bound pods on the simulated nodes."""


class SimulatedLoadAgents:
    """One simulated agent per node, all sampled and published together each round."""

    def __init__(
        self,
        topology_api: TopologyApi,
        source: ClusterSource,
        load: SyntheticLoad,
        *,
        nodes: Iterable[str] | None = None,
        settings: LoadSimSettings | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = topology_api
        self._source = source
        self._load = load
        self._nodes = tuple(nodes) if nodes is not None else load.nodes
        unknown = set(self._nodes) - set(load.nodes)
        if unknown:
            raise ValueError(f"nodes without a synthetic model: {sorted(unknown)}")
        self.settings = settings or LoadSimSettings()
        self._clock = clock
        self._spec_known: set[str] = set()
        self._first_seen: dict[str, float] = {}
        self._parsed: dict[str, tuple[str, BoundPod | None]] = {}
        self._pods: dict[str, list[PodLoad]] = {}
        self._truth: dict[str, LoadReport] = {}
        self._history: dict[str, deque[LoadReport]] = {
            n: deque(maxlen=self.settings.history) for n in self._nodes
        }
        self._psi: dict[str, PsiState] = {n: PsiState() for n in self._nodes}
        self._round_done = asyncio.Event()
        self.rounds = 0
        self.last_round: RoundResult | None = None

    @property
    def nodes(self) -> tuple[str, ...]:
        return self._nodes

    @property
    def load(self) -> SyntheticLoad:
        return self._load

    def replace_load(self, load: SyntheticLoad) -> None:
        """Swap the model (e.g. to add or end hotspots) from the next round on."""
        missing = set(self._nodes) - set(load.nodes)
        if missing:
            raise ValueError(f"the new model lacks nodes: {sorted(missing)}")
        self._load = load

    def truth(self, node: str) -> LoadReport | None:
        """The node's latest sample: its real load as of the last round."""
        return self._truth.get(node)

    def truths(self) -> dict[str, LoadReport]:
        return dict(self._truth)

    def history(self, node: str) -> tuple[LoadReport, ...]:
        """Samples published for the node (oldest first, up to ``settings.history``)."""
        return tuple(self._history.get(node, ()))

    def pods_on(self, node: str) -> tuple[PodLoad, ...]:
        """The pods the last round counted on the node."""
        return tuple(self._pods.get(node, ()))

    async def next_round(self) -> RoundResult:
        """Wait for the next round to complete and return it."""
        await self._round_done.wait()
        assert self.last_round is not None
        return self.last_round

    async def round(self, now: float | None = None) -> RoundResult:
        """Read pods, sample every node at ``now`` (default: the clock) and publish."""
        try:
            bodies = await self._source.bound_pods()
        except Exception as exc:  # keep publishing with the pods known from the last round
            log.warning("cannot list pods; using the previous round's", error=repr(exc))
            bodies = None
        t = self._clock() if now is None else now
        if bodies is not None:
            self._pods = self._pod_loads(bodies, t)
        reports = {
            name: self._load.sample(name, t, self._pods.get(name, ())) for name in self._nodes
        }
        self._truth.update(reports)
        gate = asyncio.Semaphore(self.settings.parallel)
        created = 0

        async def publish(name: str) -> bool:
            nonlocal created
            async with gate:
                try:
                    if name not in self._spec_known:
                        created += await self._ensure_spec(name, reports[name])
                        self._spec_known.add(name)
                    status = node_status(reports[name], self.settings.interval_s, self._psi[name])
                    await self._api.replace_status(name, status.to_status())
                except Exception as exc:
                    self._spec_known.discard(name)  # deleted or never created: look again
                    log.warning("simulated load not published", node=name, error=repr(exc))
                    return False
            self._history[name].append(reports[name])
            return True

        results = await asyncio.gather(*(publish(n) for n in self._nodes))
        ok = sum(results)
        result = RoundResult(
            time=t,
            published=ok,
            failed=len(results) - ok,
            created=created,
            pods=sum(len(p) for p in self._pods.values()),
        )
        self.rounds += 1
        self.last_round = result
        done, self._round_done = self._round_done, asyncio.Event()
        done.set()
        return result

    async def run(self, stop: asyncio.Event) -> None:
        """A round now and then every interval (on a fixed grid) until ``stop`` is set."""
        interval = self.settings.interval_s
        start = time.monotonic()
        k = 0
        while not stop.is_set():
            await self.round()
            k = max(k + 1, math.ceil((time.monotonic() - start) / interval))  # skip late ticks
            delay = start + k * interval - time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(delay, 0.0))

    async def _ensure_spec(self, name: str, report: LoadReport) -> int:
        """Create the object with a minimal spec if there is none; 1 if created."""
        if await self._api.get(name) is not None:
            return 0
        capacity = await self._source.node_capacity(name)
        cpu, mem = capacity or (report.cpu_capacity_milli, report.mem_capacity_bytes)
        uid = await self._api.node_uid(name)
        try:
            await self._api.create(
                node_topology_object(name, minimal_topology(cpu, mem), node_uid=uid)
            )
        except ConflictError:
            return 0
        return 1

    def _pod_loads(
        self, bodies: Sequence[Mapping[str, Any]], now: float
    ) -> dict[str, list[PodLoad]]:
        ours = set(self._nodes)
        seen: dict[str, float] = {}
        by_node: dict[str, list[PodLoad]] = {}
        default_ratio = self.settings.usage_ratio
        parsed: dict[str, tuple[str, BoundPod | None]] = {}
        for body in bodies:
            pod = self._parse(body, parsed)
            if pod is None or pod.node not in ours:
                continue
            first = self._first_seen.get(pod.key, now)
            seen[pod.key] = first
            started = pod.scheduled_at if pod.scheduled_at is not None else first
            by_node.setdefault(pod.node, []).append(
                PodLoad(
                    cpu_request_milli=pod.cpu_request_milli,
                    mem_request_bytes=pod.mem_request_bytes,
                    usage_ratio=default_ratio if pod.usage_ratio is None else pod.usage_ratio,
                    started_at=started,
                    warmup_s=self.settings.warmup_s,
                )
            )
        self._first_seen = seen
        self._parsed = parsed
        return by_node

    def _parse(
        self, body: Mapping[str, Any], parsed: dict[str, tuple[str, BoundPod | None]]
    ) -> BoundPod | None:
        """:func:`bound_pod`, reusing last round's answer for an unchanged resourceVersion."""
        meta = body.get("metadata")
        if not isinstance(meta, Mapping):
            return None
        key = str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")
        rv = meta.get("resourceVersion")
        cached = self._parsed.get(key)
        pod = cached[1] if rv and cached is not None and cached[0] == rv else bound_pod(body)
        if rv:
            parsed[key] = (str(rv), pod)
        return pod


def kubernetes_agents(
    api: client.ApiClient,
    load: SyntheticLoad,
    *,
    nodes: Iterable[str] | None = None,
    settings: LoadSimSettings | None = None,
) -> SimulatedLoadAgents:
    """Simulated agents publishing to a cluster; start them with ``agents.run(stop)``."""
    return SimulatedLoadAgents(
        KubernetesTopologyApi(api),
        KubernetesClusterSource(api),
        load,
        nodes=nodes,
        settings=settings,
    )

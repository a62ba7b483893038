"""What nodes report beside their Node objects: our agents' NodeTopology (hardware and
load) and NFD's NodeResourceTopology, from the watch into the device ledger and the load
predictor.

Kept apart from the scheduler because it is a world of its own: it owns which report
inputs were last read (agents rewrite their status every few seconds and their spec almost
never; NFD rewrites unchanged objects every minute, so each is re-parsed only when what
placement reads changed) and when a new load sample can wake pods (only while a load
filter is configured: without thresholds no sample makes an unschedulable pod
schedulable). A report that cannot be read is logged and dropped, never fatal: a broken
spec removes the node's devices, a broken status loses one load sample.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from scheduler.control.queue import ClusterEvent, ClusterEventType, SchedulingQueue
from scheduler.control.queued import QueuedPod
from scheduler.control.settings import SchedulerSettings
from scheduler.core.load import load_report
from scheduler.core.topology.state import TopologyState
from scheduler.model.errors import InvalidObjectError
from scheduler.model.noderesourcetopology import NodeResourceTopology
from scheduler.model.topology import (
    NodeLoad,
    NodeTopology,
    NodeTopologyStatus,
    PressureReadings,
    TopologyParseError,
)
from scheduler.obs.metrics import Metrics
from scheduler.predict import LoadPredictor, ObserveOutcome

Body = Mapping[str, Any]


def _name(body: Body) -> str:
    return str((body.get("metadata") or {}).get("name", ""))


class NodeReports:
    """NodeTopology and NodeResourceTopology handlers (see the module docstring)."""

    def __init__(
        self,
        *,
        topology: TopologyState,
        load: LoadPredictor,
        queue: SchedulingQueue[QueuedPod],
        metrics: Metrics,
        settings: Callable[[], SchedulerSettings],
        wall_clock: Callable[[], float],
        log: Any,
    ) -> None:
        self.topology = topology
        self.load = load
        self.queue = queue
        self.metrics = metrics
        self._settings = settings
        """Read at each use: ``apply_settings`` replaces the scheduler's settings."""
        self.wall_clock = wall_clock
        self.log = log
        self._topology_specs: dict[str, Any] = {}
        self._nrt_inputs: dict[str, Any] = {}
        """Per node, the parts of its NodeResourceTopology that placement reads."""
        self._last_cpu: dict[str, float] = {}

    # -- NodeTopology (our agents) ------------------------------------------------------
    def topology_upserted(self, body: Body) -> None:
        """Hardware (spec) and heartbeat with load (status). The spec is parsed only when
        it changed; a broken status loses the load sample only."""
        name = _name(body)
        spec = body.get("spec") or {}
        if self._topology_specs.get(name) != spec:
            try:
                report = NodeTopology.from_spec(spec)
            except (TopologyParseError, InvalidObjectError, ValueError) as exc:
                self.log.warning("topology_unreadable", node=name, reason=str(exc))
                self._topology_specs.pop(name, None)
                self.topology.remove_node_topology(name)
            else:
                self._topology_specs[name] = spec
                self.topology.set_node_topology(name, report)
                self.queue.move_all_on_event(
                    ClusterEvent(ClusterEventType.NODE_TOPOLOGY_CHANGED, subject=name)
                )
        raw_status = body.get("status")
        if not raw_status:
            return
        try:
            status = NodeTopologyStatus.from_status(raw_status)
        except (TopologyParseError, ValueError) as exc:
            self.log.warning("load_report_unreadable", node=name, reason=str(exc))
            self.metrics.load_reports.labels(outcome="unreadable").inc()
            return
        if status.load is not None:
            self._observe_load(name, status.load, status.pressure)

    def topology_deleted(self, body: Body) -> None:
        name = _name(body)
        self._topology_specs.pop(name, None)
        self.topology.remove_node_topology(name)
        self.node_gone(name)

    def topology_names(self) -> set[str]:
        """Nodes whose NodeTopology is known (a re-list reconciles them)."""
        return set(self._topology_specs) | set(self._last_cpu)

    def node_gone(self, name: str) -> None:
        """The node (or its report) is gone: its load history goes with it."""
        self.load.forget_node(name)
        self._last_cpu.pop(name, None)

    def _observe_load(self, node: str, load: NodeLoad, pressure: PressureReadings | None) -> None:
        before = self.load.status(node, self.wall_clock())
        outcome = self.load.observe_report(load_report(node, load, pressure), now=self.wall_clock())
        self.metrics.load_reports.labels(outcome=outcome.name.lower()).inc()
        if outcome is not ObserveOutcome.ACCEPTED:
            if outcome is not ObserveOutcome.DUPLICATE:
                self.log.warning("load_report_ignored", node=node, reason=outcome.name.lower())
            return
        # Only a load filter can have rejected a pod for load; without thresholds new
        # samples never make an unschedulable pod schedulable, so they move nothing.
        if self.load_filter_on() and (
            load.cpu_fraction < self._last_cpu.get(node, 1.0) or before.name != "FRESH"
        ):
            self.queue.move_all_on_event(
                ClusterEvent(ClusterEventType.NODE_LOAD_DECREASED, subject=node)
            )
        self._last_cpu[node] = load.cpu_fraction

    def load_filter_on(self) -> bool:
        return self._settings().profile.load_aware.predict.filters

    # -- NodeResourceTopology (NFD's topology-updater) ----------------------------------
    def nrt_upserted(self, body: Body) -> None:
        """The NUMA view of a node without our agent. Re-read only when zones or policy
        changed (the updater rewrites the object every minute with the same content)."""
        name = _name(body)
        inputs = (body.get("zones"), body.get("attributes"), body.get("topologyPolicies"))
        if self._nrt_inputs.get(name) == inputs:
            return
        try:
            nrt = NodeResourceTopology.from_api(body)
        except (TopologyParseError, InvalidObjectError, ValueError) as exc:
            self.log.warning("topology_unreadable", node=name, reason=str(exc))
            self._nrt_inputs.pop(name, None)
            self.topology.remove_node_resource_topology(name)
            return
        self._nrt_inputs[name] = inputs
        self.topology.set_node_resource_topology(nrt)
        self.queue.move_all_on_event(
            ClusterEvent(ClusterEventType.NODE_TOPOLOGY_CHANGED, subject=name)
        )

    def nrt_deleted(self, body: Body) -> None:
        name = _name(body)
        self._nrt_inputs.pop(name, None)
        self.topology.remove_node_resource_topology(name)

    def nrt_names(self) -> set[str]:
        """Nodes whose NodeResourceTopology is in use (a full list reconciles them)."""
        return set(self._nrt_inputs)

"""TopologyState: what the controller keeps next to the Snapshot for the Topology plugin.

The Snapshot stays as it is (one columnar row per node); topology lives here, keyed by node
name, and is handed to each cycle (``Framework.schedule(..., topology=state)``). It holds

* per node, its topology source: the Lattice agent's NodeTopology, else a
  NodeResourceTopology (NUMA only), else nothing;
* the :class:`DeviceLedger` of what placed pods hold;
* caches: compiled layouts (interned, so identical nodes share one), free state per node
  per ledger generation, and device choices per (layout, free state, request). Most nodes of
  a fleet are in one of a few states, so a GPU pod costs a few real choices per cycle.

Not thread-safe, like the Snapshot: the controller owns it and the core reads it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Final

from scheduler.core.gpus import GpuDemand
from scheduler.core.profile import TopologyArgs
from scheduler.core.topology.allocate import Choice, FreeState, Level, all_free, choose, free_state
from scheduler.core.topology.layout import (
    NodeLayout,
    from_node_resource_topology,
    from_node_topology,
)
from scheduler.core.topology.ledger import DeviceLedger
from scheduler.core.topology.request import TopologyRequest
from scheduler.model.noderesourcetopology import NodeResourceTopology
from scheduler.model.pod import Pod
from scheduler.model.topology import NodeTopology

if TYPE_CHECKING:
    from scheduler.core.explain import Decision

_CHOICE_CACHE_SIZE: Final = 8192

_Source = NodeTopology | NodeResourceTopology


class TopologyState:
    def __init__(self, args: TopologyArgs | None = None) -> None:
        self.args = args or TopologyArgs()
        self.ledger = DeviceLedger(self.args)
        # The GPU request mix (GPUPlacement's fragmentation score): arrivals and pending pods.
        self.gpu_demand = GpuDemand()
        self._reports: dict[str, NodeTopology] = {}
        self._nrt: dict[str, NodeResourceTopology] = {}
        self._layouts: dict[str, tuple[NodeLayout, int]] = {}
        """Node -> (layout, serial); the serial names the layout in cache keys."""
        self._interned: dict[Hashable, tuple[NodeLayout, int]] = {}
        self._serials = 0
        self._pinning: set[str] = set()
        self._free: dict[str, tuple[Hashable, FreeState]] = {}
        self._choices: OrderedDict[Hashable, Choice | None] = OrderedDict()

    # ---------------------------------------------------------------- sources
    def set_node_topology(self, node_name: str, topology: NodeTopology) -> None:
        """The node's NodeTopology (from ``NodeTopology.from_spec(obj["spec"])``)."""
        self._reports[node_name] = topology
        self._relayout(node_name)

    def remove_node_topology(self, node_name: str) -> None:
        if self._reports.pop(node_name, None) is not None:
            self._relayout(node_name)

    def set_node_resource_topology(self, nrt: NodeResourceTopology) -> None:
        """A NodeResourceTopology; used only while the node has no NodeTopology."""
        self._nrt[nrt.node_name] = nrt
        self._relayout(nrt.node_name)

    def remove_node_resource_topology(self, node_name: str) -> None:
        if self._nrt.pop(node_name, None) is not None:
            self._relayout(node_name)

    def remove_node(self, node_name: str) -> None:
        """Drop both sources of a deleted node (its pods leave through ``pod_removed``)."""
        self._reports.pop(node_name, None)
        self._nrt.pop(node_name, None)
        self._relayout(node_name)

    # -------------------------------------------------------------------- pods
    def pod_placed(
        self, pod: Pod, node_name: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        """A pod bound to (or assumed on) a node; see :meth:`DeviceLedger.pod_placed`."""
        self.ledger.pod_placed(pod, node_name, annotations)

    def pod_removed(self, pod_key: str) -> None:
        self.ledger.pod_removed(pod_key)

    def assume(self, decision: Decision) -> None:
        """Count a decision's devices as used until its binding lands or fails."""
        if decision.selected is not None:
            self.ledger.pod_placed(decision.pod, decision.selected, decision.annotations)

    # ------------------------------------------------------------------- reads
    def layout(self, node_name: str) -> NodeLayout | None:
        entry = self._layouts.get(node_name)
        return entry[0] if entry is not None else None

    def serial(self, node_name: str) -> int | None:
        """Names the node's layout: nodes with equal serials have equal hardware."""
        entry = self._layouts.get(node_name)
        return entry[1] if entry is not None else None

    def node_names(self) -> frozenset[str]:
        """Nodes with a topology source of either kind."""
        return frozenset(self._layouts)

    def has_topology(self) -> bool:
        return bool(self._layouts)

    def pins_cpus_anywhere(self) -> bool:
        """Some node enforces single-NUMA placement of pinned CPUs (cheap PreFilter test)."""
        return bool(self._pinning)

    def free(self, node_name: str, allocatable_cpus: int | None) -> FreeState | None:
        entry = self._layouts.get(node_name)
        if entry is None:
            return None
        layout, serial = entry
        key = (serial, self.ledger.generation(node_name), allocatable_cpus)
        cached = self._free.get(node_name)
        if cached is not None and cached[0] == key:
            return cached[1]
        holdings = (h for _, h in self.ledger.holdings(node_name))
        state = free_state(layout, holdings, allocatable_cpus)
        self._free[node_name] = (key, state)
        return state

    def choose(
        self,
        node_name: str,
        free: FreeState | None,
        request: TopologyRequest,
        required: Level,
        *,
        pin_cpus: bool,
    ) -> Choice | None:
        """:func:`allocate.choose` on the node's layout, memoised; ``free=None`` means the
        node empty (what its hardware allows at best)."""
        layout, serial = self._layouts[node_name]
        state_key = None if free is None else free.key
        key = (serial, state_key, request.key, required, pin_cpus)
        if key in self._choices:
            self._choices.move_to_end(key)
            return self._choices[key]
        state = free if free is not None else all_free(layout)
        result = choose(layout, state, request, required, pin_cpus=pin_cpus)
        self._choices[key] = result
        if len(self._choices) > _CHOICE_CACHE_SIZE:
            self._choices.popitem(last=False)
        return result

    # --------------------------------------------------------------- internals
    def _relayout(self, node_name: str) -> None:
        source: _Source | None = self._reports.get(node_name) or self._nrt.get(node_name)
        self._pinning.discard(node_name)
        if source is None:
            self._layouts.pop(node_name, None)
            self._free.pop(node_name, None)
            return
        # A republished, unchanged report maps to the same entry, so cached free state
        # (keyed by the serial) stays valid across agent heartbeats.
        key = _intern_key(source)
        entry = self._interned.get(key)
        if entry is None:
            args = self.args
            if isinstance(source, NodeTopology):
                layout = from_node_topology(source, args.gpu_resource, args.rdma_resource)
            else:
                layout = from_node_resource_topology(source, args.gpu_resource, args.rdma_resource)
            self._serials += 1
            entry = self._interned[key] = (layout, self._serials)
            live = {serial for _, serial in self._layouts.values()} | {self._serials}
            if len(self._interned) > 2 * len(live) + 16:
                self._interned = {k: e for k, e in self._interned.items() if e[1] in live}
        self._layouts[node_name] = entry
        if entry[0].single_numa and entry[0].pins_cpus:
            self._pinning.add(node_name)


def _intern_key(source: _Source) -> Hashable:
    """Equal hardware gives equal keys; a NodeResourceTopology's node name does not count."""
    if isinstance(source, NodeTopology):
        return source
    zones = tuple(
        (
            z.numa_id,
            tuple(
                sorted(
                    (name, r.capacity, r.allocatable, r.available)
                    for name, r in z.resources.items()
                )
            ),
            tuple(sorted(z.costs.items())),
        )
        for z in source.zones
    )
    return ("nrt", zones, source.topology_manager_policy, source.topology_manager_scope)

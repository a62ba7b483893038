"""Topology-aware device placement: the state and algorithms behind the Topology plugin.

Theory of operation
-------------------
The controller keeps a :class:`TopologyState` next to the Snapshot and passes it to every
cycle (``Framework.schedule(snapshot, pod, topology=state)``). It is fed from three watches:

* NodeTopology objects (``lattice.dev/v1alpha1``, written by Lattice's node agent): NUMA
  nodes, the PCIe tree and every GPU and RDMA NIC in it;
* NodeResourceTopology objects (``topology.node.k8s.io``, from NFD or the RTE): NUMA zones
  only, used for nodes without a NodeTopology;
* bound pods: their ``lattice.dev/devices`` annotation says which devices they hold, so the
  :class:`DeviceLedger` is rebuilt from the cluster after a restart.

Per cycle the Topology plugin compiles each node's source into a :class:`NodeLayout`
(interned), derives the free devices from the ledger, and picks devices
(:func:`allocate.choose`): the admissible set with the fewest NUMA nodes, then the lowest
PCIe/NUMA cost, then the best packing. Its choice for the selected node comes back in
``Decision.annotations``; the binder writes it with the binding and the ledger counts it.

Pure: no I/O, no clients; the state is a plain object the controller mutates.
"""

from scheduler.core.topology.allocate import Choice, Level
from scheduler.core.topology.layout import NodeLayout
from scheduler.core.topology.ledger import DeviceAssignment, DeviceLedger
from scheduler.core.topology.request import (
    ALIGNMENT_ANNOTATION,
    DEVICES_ANNOTATION,
    RDMA_ANNOTATION,
    TopologyRequest,
)
from scheduler.core.topology.state import TopologyState

__all__ = [
    "ALIGNMENT_ANNOTATION",
    "DEVICES_ANNOTATION",
    "RDMA_ANNOTATION",
    "Choice",
    "DeviceAssignment",
    "DeviceLedger",
    "Level",
    "NodeLayout",
    "TopologyRequest",
    "TopologyState",
]

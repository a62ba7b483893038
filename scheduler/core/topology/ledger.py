"""Which devices and NUMA nodes the pods on each node hold, derived from the pods themselves.

Lattice writes its choice on the pod with the binding, as the annotation::

    lattice.dev/devices: {"gpus":[0,1],"nics":["0000:3b:00.0"],"numa":0}

``gpus`` are device indexes (``nvidia-smi`` numbering, the agent's ``deviceIndex``),
``nics`` PCI addresses of RDMA NICs, ``numa`` the NUMA node id holding everything the pod
was aligned to (its GPUs, NICs and, on single-numa-node nodes, its pinned CPUs), or null
when they span NUMA nodes. On nodes known only from a NodeResourceTopology the device
identities are unknown, so ``gpus`` is empty and ``numa`` says where they are.

Theory of operation: the ledger is fed every pod bound to a node (``pod_placed``) and told
when it leaves (``pod_removed``), from the same watch that feeds the snapshot, so after a
restart replaying the bound pods rebuilds exactly the same usage: nothing lives only in
the scheduler's memory. A pod Lattice has chosen but not yet bound is recorded the same
way with the decision's annotations (assume), and forgotten if the binding fails.

Pods without the annotation (placed by another scheduler, or before their node had a
topology report) still hold devices: their GPU, NIC and pinned-CPU counts are recorded as
*unattributed* and assumed to take the lowest free device indexes, which is what a kubelet
without topology hints tends to hand out. That is a guess; it keeps the counts right.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.core.profile import TopologyArgs
from scheduler.core.topology.request import DEVICES_ANNOTATION, TopologyRequest
from scheduler.model.pod import Pod


@dataclass(frozen=True, slots=True)
class DeviceAssignment:
    """The devices and NUMA node chosen for one pod on its node."""

    gpus: tuple[int, ...] = ()
    nics: tuple[str, ...] = ()
    numa: int | None = None

    def to_annotation(self) -> str:
        body: dict[str, Any] = {"gpus": list(self.gpus), "nics": list(self.nics)}
        body["numa"] = self.numa
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def from_annotation(cls, text: str) -> DeviceAssignment | None:
        """Parse the annotation; None when it is not one Lattice wrote."""
        try:
            body = json.loads(text)
        except ValueError:
            return None
        if not isinstance(body, dict):
            return None
        gpus, nics, numa = body.get("gpus", []), body.get("nics", []), body.get("numa")
        if not isinstance(gpus, list) or not all(
            isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus
        ):
            return None
        if not isinstance(nics, list) or not all(isinstance(n, str) for n in nics):
            return None
        if numa is not None and (isinstance(numa, bool) or not isinstance(numa, int)):
            return None
        return cls(tuple(gpus), tuple(nics), numa)


@dataclass(frozen=True, slots=True)
class Holding:
    """What one placed pod holds on its node."""

    node: str
    assignment: DeviceAssignment | None
    """What Lattice recorded; None for unattributed pods."""
    gpus: int
    nics: int
    """Exclusive NICs (requested as a resource)."""
    cpus: int


class DeviceLedger:
    """Per-node device holdings of placed pods; the controller feeds it, the core reads it."""

    def __init__(self, args: TopologyArgs | None = None) -> None:
        self.args = args or TopologyArgs()
        self._by_pod: dict[str, Holding] = {}
        self._by_node: dict[str, dict[str, Holding]] = {}
        self._generation: dict[str, int] = {}
        self._clock = 0

    def pod_placed(
        self, pod: Pod, node_name: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        """Record a bound (or assumed) pod; ``annotations`` override the pod's own, for an
        assumed pod whose decision annotations are not on the object yet. Idempotent."""
        request = _request(pod, self.args)
        text = (annotations or {}).get(DEVICES_ANNOTATION, pod.annotations.get(DEVICES_ANNOTATION))
        assignment = DeviceAssignment.from_annotation(text) if text is not None else None
        exclusive_nics = 0 if request.shared_nic else request.nics
        if assignment is None and not (request.gpus or exclusive_nics or request.cpus):
            self.pod_removed(pod.key)
            return
        holding = Holding(node_name, assignment, request.gpus, exclusive_nics, request.cpus)
        if self._by_pod.get(pod.key) == holding:
            return
        self.pod_removed(pod.key)
        self._by_pod[pod.key] = holding
        self._by_node.setdefault(node_name, {})[pod.key] = holding
        self._touch(node_name)

    def pod_removed(self, pod_key: str) -> None:
        """Forget a pod (deleted, finished, or its binding failed); unknown keys are ignored."""
        holding = self._by_pod.pop(pod_key, None)
        if holding is None:
            return
        on_node = self._by_node.get(holding.node, {})
        on_node.pop(pod_key, None)
        if not on_node:
            self._by_node.pop(holding.node, None)
        self._touch(holding.node)

    def holdings(self, node_name: str) -> Iterator[tuple[str, Holding]]:
        """(pod key, holding) on a node, in key order so derived usage is deterministic."""
        on_node = self._by_node.get(node_name, {})
        for key in sorted(on_node):
            yield key, on_node[key]

    def holding(self, pod_key: str) -> Holding | None:
        return self._by_pod.get(pod_key)

    def generation(self, node_name: str) -> int:
        """Changes whenever the node's holdings change (a cache key for derived state)."""
        return self._generation.get(node_name, 0)

    def __len__(self) -> int:
        return len(self._by_pod)

    def _touch(self, node_name: str) -> None:
        self._clock += 1
        self._generation[node_name] = self._clock


def _request(pod: Pod, args: TopologyArgs) -> TopologyRequest:
    try:
        return TopologyRequest.from_pod(pod, args)
    except ValueError:
        # A bound pod with a malformed annotation still holds what it requested.
        requests = pod.resources.requests
        return TopologyRequest(
            gpus=requests.get(args.gpu_resource, 0),
            nics=requests.get(args.rdma_resource, 0),
            cpus=pod.exclusive_cpus,
        )

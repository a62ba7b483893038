"""NodePorts: a host port (hostIP, protocol, port) can be used by one pod per node.

Only nodes that already have used host ports are inspected, so the cost is proportional to
the number of such nodes. ``0.0.0.0`` conflicts with every address of the same protocol and
port (``HostPortInfo.CheckConflict``).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

import numpy as np

from scheduler.core.framework import (
    PREFILTER_SKIP,
    PREFILTER_SUCCESS,
    Code,
    Cycle,
    FilterResult,
    PreFilterResult,
)
from scheduler.core.profile import NODE_PORTS, Profile
from scheduler.core.snapshot import BoolArray
from scheduler.model.pod import DEFAULT_BIND_ALL_HOST_IP, HostPort

NAME: Final = NODE_PORTS
REASON: Final = "node(s) didn't have free ports for the requested pod ports"


def conflicts(wanted: HostPort, used: Collection[HostPort]) -> bool:
    if wanted.host_ip == DEFAULT_BIND_ALL_HOST_IP:
        return any(u.protocol == wanted.protocol and u.port == wanted.port for u in used)
    bind_all = HostPort(DEFAULT_BIND_ALL_HOST_IP, wanted.protocol, wanted.port)
    return bind_all in used or wanted in used


class NodePorts:
    name: Final = NAME

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        return PREFILTER_SUCCESS if cycle.pod.host_ports else PREFILTER_SKIP

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        snapshot = cycle.snapshot
        busy = np.zeros(cycle.num_nodes, dtype=np.bool_)
        for i in snapshot.nodes_with_used_ports():
            used = snapshot.used_ports(i)
            busy[i] = any(conflicts(p, used) for p in cycle.pod.host_ports)
        if not busy.any():
            return None
        return FilterResult.from_mask(busy, REASON, Code.UNSCHEDULABLE)


def new(profile: Profile) -> NodePorts:
    return NodePorts()

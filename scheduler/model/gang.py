"""The neutral gang model: what the scheduler knows of a group of pods that must start
together, whatever API the group came from.

Today the only adapter is scheduler-plugins' ``PodGroup`` (``scheduler.model.podgroup``);
the upstream Workload API (KEP-4671) can be a second one that builds the same record. The
scheduler, the queue and the solver only ever see :class:`GangSpec`.

A gang is *admitted* once ``min_member`` of its members are placed (bound or assumed);
members beyond that are scheduled like ordinary pods. Until then it is one queue entry,
placed all-or-nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

POD_GROUP_LABEL: Final = "scheduling.x-k8s.io/pod-group"
"""The label a pod joins a PodGroup with (scheduler-plugins' coscheduling)."""

TOPOLOGY_REQUIRED_ANNOTATION: Final = "lattice.dev/topology-required"
"""PodGroup annotation: a node label key; all members go to one domain of that key, or
none is placed."""
GANG_TOPOLOGY_ANNOTATION: Final = "lattice.dev/gang-topology"
"""The older name of :data:`TOPOLOGY_REQUIRED_ANNOTATION`, still read."""
TOPOLOGY_PREFERRED_ANNOTATION: Final = "lattice.dev/topology-preferred"
"""PodGroup annotation: a node label key; members in the fewest domains of that key the
free capacity allows (one where possible), compact at every wider level of
``spec.topology.levels`` too, the fullest domains that still hold them first."""
TOPOLOGY_SLICE_SIZE_ANNOTATION: Final = "lattice.dev/topology-slice-size"
"""PodGroup annotation: members per slice (a tensor-parallel group), a positive integer
that divides ``minMember``; set together with :data:`TOPOLOGY_SLICE_REQUIRED_ANNOTATION`."""
TOPOLOGY_SLICE_REQUIRED_ANNOTATION: Final = "lattice.dev/topology-slice-required"
"""PodGroup annotation: a level of ``spec.topology.levels``; each slice's members go to
nodes of one domain of it."""
TOPOLOGY_SLICE_ANNOTATION: Final = "lattice.dev/topology-slice"
"""Binding annotation (copied onto the pod by the API server): the member's slice, 0..S-1,
for the workload to find its neighbours through the downward API."""


def gang_key(namespace: str, name: str) -> str:
    """``namespace/name`` of the group, the same shape as a pod key."""
    return f"{namespace}/{name}"


@dataclass(frozen=True, slots=True, kw_only=True)
class GangSpec:
    """One gang's scheduling contract, parsed once per change of its source object."""

    namespace: str
    name: str
    uid: str = ""
    min_member: int = 1
    """Members that must be placed together before any is bound."""
    min_resources: Mapping[str, int] = field(default_factory=dict)
    """Integer amounts (cpu in millicores) the whole gang needs; checked before a solve."""
    schedule_timeout_s: int | None = None
    """Seconds from :attr:`schedule_start_time` after which an unadmitted gang is Failed."""
    topology_key: str | None = None
    """Required: all members in one domain of this node label key (None: anywhere)."""
    topology_preferred: str | None = None
    """Preferred: the fewest domains of this node label key (None: no preference)."""
    slice_size: int | None = None
    """Members per slice (None: no slices)."""
    slice_key: str | None = None
    """The level each slice stays inside one domain of (set with :attr:`slice_size`)."""
    schedule_start_time: float | None = None
    """Unix time the gang first reached quorum, from the source object's status, so that a
    restart does not reset the timeout."""
    generation: int | None = None

    @property
    def key(self) -> str:
        return gang_key(self.namespace, self.name)

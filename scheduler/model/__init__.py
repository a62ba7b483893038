"""Pure data for scheduling: exact quantities, selectors, pod/node/namespace records.

Nothing here does I/O; records are frozen and parsed from plain API dicts with
``Pod.from_api`` / ``Node.from_api`` / ``Namespace.from_api``. Malformed input raises
:class:`InvalidObjectError`.
"""

from scheduler.model.errors import InvalidObjectError
from scheduler.model.node import Namespace, Node, Taint, TaintEffect
from scheduler.model.pod import (
    HostPort,
    InclusionPolicy,
    Pod,
    PodAffinityTerm,
    PodResources,
    Toleration,
    TopologySpreadConstraint,
    UnsatisfiableAction,
    WeightedPodAffinityTerm,
)
from scheduler.model.quantity import Quantity
from scheduler.model.selectors import (
    LabelSelector,
    NodeSelector,
    NodeSelectorTerm,
    Operator,
    PreferredSchedulingTerm,
    Requirement,
)

__all__ = [
    "HostPort",
    "InclusionPolicy",
    "InvalidObjectError",
    "LabelSelector",
    "Namespace",
    "Node",
    "NodeSelector",
    "NodeSelectorTerm",
    "Operator",
    "Pod",
    "PodAffinityTerm",
    "PodResources",
    "PreferredSchedulingTerm",
    "Quantity",
    "Requirement",
    "Taint",
    "TaintEffect",
    "Toleration",
    "TopologySpreadConstraint",
    "UnsatisfiableAction",
    "WeightedPodAffinityTerm",
]

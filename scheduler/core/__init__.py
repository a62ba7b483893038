"""Pure scheduling: snapshot, plugin framework, filters and scores, explanations.

Entry point: ``schedule(snapshot, pod, profile, seed, topology=state) -> Decision``. No I/O,
no Kubernetes client: callers build a :class:`Snapshot` from model records and keep it
updated, and keep node topologies and device usage in a :class:`TopologyState` beside it.
"""

from scheduler.core.explain import Decision, Explanation, NodeVerdict
from scheduler.core.framework import Code, Cycle, FilterResult, PreFilterResult
from scheduler.core.profile import DEFAULT_PROFILE, Profile, ScoringStrategy
from scheduler.core.registry import DuplicatePluginError, Registry, default_registry
from scheduler.core.schedule import Framework, schedule
from scheduler.core.snapshot import Snapshot
from scheduler.core.topology import TopologyState

__all__ = [
    "DEFAULT_PROFILE",
    "Code",
    "Cycle",
    "Decision",
    "DuplicatePluginError",
    "Explanation",
    "FilterResult",
    "Framework",
    "NodeVerdict",
    "PreFilterResult",
    "Profile",
    "Registry",
    "ScoringStrategy",
    "Snapshot",
    "TopologyState",
    "default_registry",
    "schedule",
]

"""The plugin registry: plugin name -> factory, refusing duplicates.

A factory takes the :class:`Profile` (so plugins read their typed arguments from it) and
returns an object implementing some of the extension-point protocols. Building a profile
instantiates each named plugin once and checks it implements what the profile asks of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from scheduler.core.framework import (
    AnnotatePlugin,
    ClaimPlanPlugin,
    FilterPlugin,
    Plugin,
    PluginSet,
    PreferPlugin,
    PreFilterPlugin,
    ScorePlugin,
    VolumePlanPlugin,
)
from scheduler.core.plugins import (
    balanced_allocation,
    capacity_scheduling,
    dynamic_resources,
    gpu_placement,
    inter_pod_affinity,
    load_aware,
    node_affinity,
    node_declared_features,
    node_name,
    node_ports,
    node_resources_fit,
    node_unschedulable,
    node_volume_limits,
    pod_topology_spread,
    taint_toleration,
    topology,
    unsupported,
    volume_binding,
    volume_restrictions,
    volume_zone,
)
from scheduler.core.profile import Profile

PluginFactory = Callable[[Profile], Plugin]

IN_TREE: Final[tuple[tuple[str, PluginFactory], ...]] = (
    (unsupported.NAME, unsupported.new),
    (capacity_scheduling.NAME, capacity_scheduling.new),
    (node_unschedulable.NAME, node_unschedulable.new),
    (node_name.NAME, node_name.new),
    (taint_toleration.NAME, taint_toleration.new),
    (node_affinity.NAME, node_affinity.new),
    (node_ports.NAME, node_ports.new),
    (node_resources_fit.NAME, node_resources_fit.new),
    (volume_restrictions.NAME, volume_restrictions.new),
    (node_volume_limits.NAME, node_volume_limits.new),
    (volume_binding.NAME, volume_binding.new),
    (volume_zone.NAME, volume_zone.new),
    (pod_topology_spread.NAME, pod_topology_spread.new),
    (inter_pod_affinity.NAME, inter_pod_affinity.new),
    (dynamic_resources.NAME, dynamic_resources.new),
    (node_declared_features.NAME, node_declared_features.new),
    (balanced_allocation.NAME, balanced_allocation.new),
    (topology.NAME, topology.new),
    (load_aware.NAME, load_aware.new),
    (gpu_placement.NAME, gpu_placement.new),
)


class DuplicatePluginError(ValueError):
    """A plugin name was registered twice."""


class UnknownPluginError(KeyError):
    """A profile names a plugin the registry does not know, or one lacking an extension point."""


class Registry:
    def __init__(self) -> None:
        self._factories: dict[str, PluginFactory] = {}

    def register(self, name: str, factory: PluginFactory) -> None:
        if name in self._factories:
            raise DuplicatePluginError(f"plugin {name!r} is already registered")
        self._factories[name] = factory

    def names(self) -> tuple[str, ...]:
        return tuple(self._factories)

    def build(self, profile: Profile) -> PluginSet:
        instances: dict[str, Plugin] = {}

        def get(name: str) -> Plugin:
            if name not in instances:
                factory = self._factories.get(name)
                if factory is None:
                    raise UnknownPluginError(f"profile {profile.name!r}: unknown plugin {name!r}")
                instances[name] = factory(profile)
            return instances[name]

        filters: list[FilterPlugin] = []
        pre_filters: list[PreFilterPlugin] = []
        for name in profile.filters:
            plugin = get(name)
            if not isinstance(plugin, FilterPlugin):
                raise UnknownPluginError(f"profile {profile.name!r}: {name!r} is not a filter")
            filters.append(plugin)
            if isinstance(plugin, PreFilterPlugin):
                pre_filters.append(plugin)
        scores: list[tuple[ScorePlugin, int]] = []
        for name, weight in profile.scores:
            plugin = get(name)
            if not isinstance(plugin, ScorePlugin):
                raise UnknownPluginError(f"profile {profile.name!r}: {name!r} does not score")
            scores.append((plugin, weight))
        annotators = tuple(p for p in instances.values() if isinstance(p, AnnotatePlugin))
        preferences = tuple(p for p, _ in scores if isinstance(p, PreferPlugin))
        planners = tuple(p for p in filters if isinstance(p, VolumePlanPlugin))
        claim_planners = tuple(p for p in filters if isinstance(p, ClaimPlanPlugin))
        return PluginSet(
            tuple(pre_filters),
            tuple(filters),
            tuple(scores),
            annotators,
            preferences,
            planners,
            claim_planners,
        )


def default_registry() -> Registry:
    registry = Registry()
    for name, factory in IN_TREE:
        registry.register(name, factory)
    return registry

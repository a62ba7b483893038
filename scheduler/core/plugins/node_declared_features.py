"""NodeDeclaredFeatures: a pod that needs a node feature fits only nodes declaring it.

kube-scheduler's ``plugins/nodedeclaredfeatures`` (KEP-5328). PreFilter infers from the
pod's spec the features it needs (restart-all-containers rules, hostNetwork with user
namespaces, bind-mount options: :mod:`scheduler.model.declared_features`) among those the
release's kube-scheduler knows, and skips the pod when there are none: nearly every pod, at
the cost of one empty-set test, since the pod record carries its needs from parsing. Filter
rejects, UnschedulableAndUnresolvable, every node whose ``status.declaredFeatures`` lacks one
of them, by one vector operation on the snapshot's per-node feature bits.

Per release, as kube's default gates have it: the gate NodeDeclaredFeatures is alpha and off
in 1.35 (the plugin is then kube's disabled no-op), beta and on in 1.36, GA in 1.37. The
features a release knows are those of its component-helpers registry that can be inferred
for scheduling: 1.36 (v0.36.3) has RestartAllContainersOnContainerExits and
UserNamespacesHostNetworkSupport, 1.37 (v0.37.2) adds VolumeBindMountOptions. A feature
stops being required once the release is past its MaxVersion (every node of such a release
has it); no feature sets one yet.

A node gaining a feature wakes the pods that need some feature: the controller sends a node
update whose declared features changed (kube's UpdateNodeDeclaredFeature event with this
plugin's queueing hint); a new node wakes every unschedulable pod anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from scheduler.core.framework import (
    PREFILTER_SKIP,
    PREFILTER_SUCCESS,
    Code,
    Cycle,
    FilterResult,
    PreFilterResult,
)
from scheduler.core.profile import NODE_DECLARED_FEATURES, Profile
from scheduler.core.snapshot import BoolArray
from scheduler.model.declared_features import (
    RESTART_ALL_CONTAINERS,
    USER_NAMESPACES_HOST_NETWORK,
    VOLUME_BIND_MOUNT_OPTIONS,
    feature_bits,
)

NAME: Final = NODE_DECLARED_FEATURES
REASON: Final = "node(s) didn't match Pod's required features"
"""kube 1.36 and 1.37 (``errReasonUnsatisfiedRequirements``); 1.35's plugin named the
missing features, but is off there."""
ENABLED_SINCE: Final = 36
"""First release whose default gates enable the plugin (NodeDeclaredFeatures beta)."""


@dataclass(frozen=True, slots=True)
class Feature:
    """A feature of kube's registry that a pod can need for scheduling."""

    name: str
    since: int
    """First release (1.x) whose kube-scheduler's registry has it."""
    max_minor: int | None = None
    """kube's MaxVersion as a release: past it the feature is no longer required. kube
    compares the full version; none is set in 1.36 or 1.37."""

    def required_at(self, kube_minor: int) -> bool:
        return self.since <= kube_minor and (self.max_minor is None or kube_minor <= self.max_minor)


FEATURES: Final = (
    Feature(RESTART_ALL_CONTAINERS, since=35),
    Feature(USER_NAMESPACES_HOST_NETWORK, since=36),
    Feature(VOLUME_BIND_MOUNT_OPTIONS, since=37),
)


def release_bits(kube_minor: int) -> int:
    """The bits of the features the release's kube-scheduler requires of nodes (0 when the
    plugin is off at that release)."""
    if kube_minor < ENABLED_SINCE:
        return 0
    return feature_bits(f.name for f in FEATURES if f.required_at(kube_minor))


class NodeDeclaredFeatures:
    name: Final = NAME

    def __init__(self, *, kube_minor: int) -> None:
        self.known = release_bits(kube_minor)

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        needed = cycle.pod.required_features
        if not needed:
            return PREFILTER_SKIP
        bits = feature_bits(needed) & self.known
        if not bits:
            return PREFILTER_SKIP
        cycle.state[NAME] = bits
        return PREFILTER_SUCCESS

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        bits: int = cycle.state[NAME]
        lacking: BoolArray = (cycle.snapshot.declared_feature_bits & bits) != bits
        if not lacking.any():
            return None
        return FilterResult.from_mask(lacking, REASON, Code.UNSCHEDULABLE_AND_UNRESOLVABLE)


def new(profile: Profile) -> NodeDeclaredFeatures:
    return NodeDeclaredFeatures(kube_minor=profile.kube_minor)

"""Helpers for core tests: run one plugin (or the default profile) and read verdicts."""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.core.explain import Decision
from scheduler.core.profile import DEFAULT_KUBE_MINOR, Profile
from scheduler.core.schedule import Framework
from scheduler.model.node import Namespace
from tests.builders import NodeLike, PodLike, as_pod, cluster


def only_filter(name: str) -> Framework:
    """A framework running a single filter plugin and no scores."""
    return Framework(Profile(name=f"only-{name}", filters=(name,), scores=()))


def only_score(name: str, weight: int = 1, *, kube_minor: int = DEFAULT_KUBE_MINOR) -> Framework:
    """A framework with no filters and a single score plugin, mirroring release 1.kube_minor."""
    return Framework(
        Profile(name=f"score-{name}", filters=(), scores=((name, weight),), kube_minor=kube_minor)
    )


def run(
    framework: Framework,
    pod: PodLike,
    nodes: Iterable[NodeLike],
    pods: Iterable[tuple[PodLike, str]] = (),
    namespaces: Iterable[Namespace] = (),
    seed: int = 0,
) -> Decision:
    return framework.schedule(cluster(nodes, pods, namespaces), as_pod(pod), seed=seed)


def reasons(decision: Decision) -> dict[str, tuple[str, ...]]:
    """Rejection reasons per node name (empty tuple for feasible nodes)."""
    explanation = decision.explanation
    return {name: explanation.node(name).reasons for name in explanation.node_names}


def scores(decision: Decision, plugin: str) -> dict[str, int]:
    """One plugin's normalised score per feasible node."""
    explanation = decision.explanation
    return {name: explanation.node(name).scores[plugin] for name in decision.feasible}

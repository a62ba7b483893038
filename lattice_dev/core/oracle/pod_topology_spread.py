"""Reference semantics of PodTopologySpread (filter and score), after kube-scheduler v1.34.

Filter (``whenUnsatisfiable: DoNotSchedule`` constraints). A node takes part in counting
only if it has the topology keys of *all* hard constraints and, per constraint, passes its
inclusion policies (nodeAffinityPolicy Honor: the pod's nodeSelector/required node affinity;
nodeTaintsPolicy Honor: no untolerated NoSchedule/NoExecute taint). Each value of the key on
such nodes is a domain; its count is the number of pods on those nodes in the incoming pod's
namespace, not terminating, matching the constraint's selector (an empty ``{}`` selector
counts nothing, as ``countPodsMatchSelector`` returns early on an empty selector). A
candidate node fails when it lacks the key ("missing required label", unresolvable) or when
``count(domain) + selfMatch - minCount > maxSkew``, where ``minCount`` is the global minimum
over domains, or 0 when there are fewer domains than ``minDomains``.

Score (``ScheduleAnyway`` constraints) over the feasible nodes: feasible nodes missing a key
are ignored (score 0); each constraint's domains are the values among the other feasible
nodes, counted over *all* nodes as above; a node scores
``sum(count * log(domains + 2) + maxSkew - 1)`` (hostname counts the node's own pods and uses
the number of scored nodes as its domain count), rounded, and normalisation inverts it so
fewer matching pods score higher.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

# The reasons and the constraint selection are the plugin's (the runtime never imports this
# reference); the loops below are the reference.
from scheduler.core.plugins.pod_topology_spread import REASON, REASON_MISSING_LABEL, constraints
from scheduler.core.snapshot import Snapshot
from scheduler.model.names import LABEL_HOSTNAME
from scheduler.model.pod import (
    InclusionPolicy,
    Pod,
    TopologySpreadConstraint,
    UnsatisfiableAction,
)

_MAX_INT32: Final = 2**31 - 1


def count_matching(
    pods: Iterable[Pod], constraint: TopologySpreadConstraint, namespace: str
) -> int:
    if constraint.selector.is_empty:
        return 0
    return sum(
        1
        for p in pods
        if not p.terminating and p.namespace == namespace and constraint.selector.matches(p.labels)
    )


def _included(constraint: TopologySpreadConstraint, affinity_ok: bool, taints_ok: bool) -> bool:
    if constraint.node_affinity_policy is InclusionPolicy.HONOR and not affinity_ok:
        return False
    return not (constraint.node_taints_policy is InclusionPolicy.HONOR and not taints_ok)


@dataclass(frozen=True, slots=True)
class FilterState:
    constraints: tuple[TopologySpreadConstraint, ...]
    counts: tuple[Counter[str], ...]
    """Per constraint: matching pods per domain value (domains with zero pods included)."""

    def min_count(self, i: int) -> int:
        counts = self.counts[i]
        if len(counts) < self.constraints[i].min_domains:
            return 0
        return min(counts.values()) if counts else _MAX_INT32


def filter_state(
    snapshot: Snapshot,
    pod: Pod,
    affinity_ok: Sequence[bool],
    taints_ok: Sequence[bool],
) -> FilterState | None:
    """PreFilter; None when the pod has no hard constraints (Skip)."""
    hard = constraints(pod, UnsatisfiableAction.DO_NOT_SCHEDULE)
    if not hard:
        return None
    counts: tuple[Counter[str], ...] = tuple(Counter() for _ in hard)
    for i in range(snapshot.num_nodes):
        labels = snapshot.node(i).labels
        if not all(c.topology_key in labels for c in hard):
            continue
        pods = list(snapshot.pods_on(i))
        for c, domain_counts in zip(hard, counts, strict=True):
            if not _included(c, affinity_ok[i], taints_ok[i]):
                continue
            domain_counts[labels[c.topology_key]] += count_matching(pods, c, pod.namespace)
    return FilterState(hard, counts)


def filter_node(
    state: FilterState, pod: Pod, node_labels: Mapping[str, str]
) -> tuple[str, bool] | None:
    """(reason, unresolvable) for a failing node, None when it passes."""
    for i, c in enumerate(state.constraints):
        value = node_labels.get(c.topology_key)
        if value is None:
            return REASON_MISSING_LABEL, True
        self_match = 1 if c.selector.matches(pod.labels) else 0
        skew = state.counts[i].get(value, 0) + self_match - state.min_count(i)
        if skew > c.max_skew:
            return REASON, False
    return None


def scores(
    snapshot: Snapshot,
    pod: Pod,
    feasible: Sequence[int],
    affinity_ok: Sequence[bool],
    taints_ok: Sequence[bool],
) -> list[int] | None:
    """Normalised 0..100 scores for ``feasible`` rows; None when PreScore would Skip."""
    soft = constraints(pod, UnsatisfiableAction.SCHEDULE_ANYWAY)
    if not soft or snapshot.num_nodes == 0:
        return None
    ignored: set[int] = set()
    domains: list[dict[str, int]] = [{} for _ in soft]
    for i in feasible:
        labels = snapshot.node(i).labels
        if not all(c.topology_key in labels for c in soft):
            ignored.add(i)
            continue
        for c, values in zip(soft, domains, strict=True):
            if c.topology_key != LABEL_HOSTNAME:
                values.setdefault(labels[c.topology_key], 0)
    weights = []
    for c, values in zip(soft, domains, strict=True):
        size = len(feasible) - len(ignored) if c.topology_key == LABEL_HOSTNAME else len(values)
        weights.append(math.log(float(size + 2)))
    for i in range(snapshot.num_nodes):
        labels = snapshot.node(i).labels
        if not all(c.topology_key in labels for c in soft):
            continue
        pods = list(snapshot.pods_on(i))
        for c, values in zip(soft, domains, strict=True):
            if not _included(c, affinity_ok[i], taints_ok[i]):
                continue
            value = labels[c.topology_key]
            if value in values:
                values[value] += count_matching(pods, c, pod.namespace)
    raw: list[int] = []
    for i in feasible:
        if i in ignored:
            raw.append(0)
            continue
        labels = snapshot.node(i).labels
        total = 0.0
        for c, values, weight in zip(soft, domains, weights, strict=True):
            node_value = labels.get(c.topology_key)
            if node_value is None:
                continue
            if c.topology_key == LABEL_HOSTNAME:
                count = count_matching(snapshot.pods_on(i), c, pod.namespace)
            else:
                count = values[node_value]
            total += float(count) * weight + float(c.max_skew - 1)
        raw.append(_go_round(total))
    return _normalize(raw, [i in ignored for i in feasible])


def _go_round(x: float) -> int:
    """Go's math.Round for non-negative values: half away from zero."""
    floor = math.floor(x)
    return int(floor + 1) if x - floor >= 0.5 else int(floor)


def _normalize(raw: list[int], ignored: list[bool]) -> list[int]:
    kept = [s for s, skip in zip(raw, ignored, strict=True) if not skip]
    if not kept:
        return [0] * len(raw)
    low, high = min(kept), max(kept)
    out = []
    for s, skip in zip(raw, ignored, strict=True):
        if skip:
            out.append(0)
        elif high == 0:
            out.append(100)
        else:
            out.append(100 * (high + low - s) // high)
    return out

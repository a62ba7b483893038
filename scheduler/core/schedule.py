"""One scheduling cycle: a snapshot and a pod in, a :class:`Decision` out.

Theory of operation, following kube-scheduler's ``schedulePod``:

1. Gated pods (``spec.schedulingGates``) are not scheduled at all.
2. PreFilter runs for every filter plugin that has one, in profile order. Skip disables the
   plugin's Filter for this pod; UnschedulableAndUnresolvable stops at once and rejects the
   pod on every node; Unschedulable is remembered while the others still run; node-name sets
   are intersected, and an empty intersection rejects the pod.
3. Filter runs plugin by plugin over the remaining candidate rows; a row leaves the
   candidates at the first plugin that rejects it and is attributed to that plugin. A row
   marked Error (an allocator error of DynamicResources) ends the attempt with that error,
   as kube's RunFilterPlugins does.
4. Score plugins score the feasible rows (0..100 each); totals are weighted sums; the
   highest total wins, ties broken by ``random.Random(seed)`` over rows in snapshot order.
5. Prefer: score plugins that also prefer (LoadAware: nodes that would run hot) name
   feasible nodes to pass over; the winner is then picked among the others, unless that
   would leave none. A lexicographic rank, so no weighting of other scores can outvote it.
6. Annotate plugins name the pod annotations the binder writes for the chosen node
   (:attr:`Decision.annotations`); VolumePlan and ClaimPlan plugins the writes before the
   binding (:attr:`Decision.volume_plan`, :attr:`Decision.claim_plan`).

kube-scheduler stops filtering once it has found enough feasible nodes in large clusters
(percentageOfNodesToScore) and may bind a nominated node first; we always evaluate every
node, so our feasible set is a superset of what kube-scheduler examined.
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from scheduler.core.explain import (
    ABSENT,
    FEASIBLE,
    PREFILTER_REJECTED,
    Decision,
    Explanation,
    FilterRecord,
    PreferenceRecord,
    Rejection,
    ScoreRecord,
)
from scheduler.core.framework import Code, Cycle, PluginSet
from scheduler.core.load import LoadView
from scheduler.core.profile import DEFAULT_PROFILE, Profile
from scheduler.core.registry import Registry, default_registry
from scheduler.core.snapshot import Snapshot
from scheduler.core.topology.state import TopologyState
from scheduler.model.pod import Pod

if TYPE_CHECKING:
    from scheduler.core.dra.search import DeviceSearch
    from scheduler.core.dra.state import ClaimPlan, DraState
    from scheduler.core.volumes import VolumePlan, VolumeState

SCHEDULING_GATES = "SchedulingGates"
PLAN = "GangPlan"
"""Names the nodes a restricted cycle (``restrict_to``) did not consider."""


class Framework:
    """A profile's plugins, instantiated once, ready to run cycles."""

    def __init__(
        self, profile: Profile = DEFAULT_PROFILE, registry: Registry | None = None
    ) -> None:
        self.profile = profile
        self.plugins: PluginSet = (registry or default_registry()).build(profile)

    def schedule(
        self,
        snapshot: Snapshot,
        pod: Pod,
        *,
        seed: int = 0,
        topology: TopologyState | None = None,
        load: LoadView | None = None,
        restrict_to: frozenset[str] | None = None,
        volumes: VolumeState | None = None,
        dra: DraState | None = None,
        search: DeviceSearch | None = None,
    ) -> Decision:
        """``restrict_to``: consider only these nodes (a gang member re-checked against its
        plan's node or domain); the others are reported as absent, not as rejected.
        ``volumes``: the cluster's storage objects; without them pods with claims are
        refused (the volume plugins cannot judge them); ``dra``: the same for DRA objects
        and pods with resource claims."""
        names = snapshot.node_names
        n = len(names)
        rejected_by = np.full(n, FEASIBLE, dtype=np.int16)
        if pod.scheduling_gates:
            message = f"waiting for scheduling gates: [{' '.join(pod.scheduling_gates)}]"
            rejected_by[:] = PREFILTER_REJECTED
            gate = Rejection(SCHEDULING_GATES, Code.UNSCHEDULABLE_AND_UNRESOLVABLE, message)
            explanation = Explanation(
                names, rejected_by, prefilter_rejection=gate, gated_message=message
            )
            return Decision(pod, None, explanation, seed)
        if n == 0:
            return Decision(pod, None, Explanation(names, rejected_by), seed)

        cycle = Cycle(
            snapshot, pod, topology=topology, load=load, volumes=volumes, dra=dra, search=search
        )
        skipped: list[str] = []
        rejection: Rejection | None = None
        allowed: frozenset[str] | None = None
        narrowing: list[str] = []
        for plugin in self.plugins.pre_filters:
            result = plugin.pre_filter(cycle)
            if result.code is Code.SKIP:
                skipped.append(plugin.name)
                continue
            if result.rejected:
                rejection = Rejection(plugin.name, result.code, result.message)
                if result.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
                    break
                continue
            if result.node_names is not None:
                narrowing.append(plugin.name)
                allowed = result.node_names if allowed is None else allowed & result.node_names
                if not allowed:
                    rejection = _empty_intersection(sorted(narrowing))
                    break
        if rejection is not None:
            rejected_by[:] = PREFILTER_REJECTED
            explanation = Explanation(
                names, rejected_by, prefilter_rejection=rejection, skipped_filters=tuple(skipped)
            )
            return Decision(pod, None, explanation, seed)

        candidates = np.ones(n, dtype=np.bool_)
        absent: Rejection | None = None
        if allowed is not None:
            candidates[:] = False
            for name in allowed:
                row = snapshot.index_of(name)
                if row is not None:
                    candidates[row] = True
            rejected_by[~candidates] = ABSENT
            absent = Rejection(
                narrowing[0],
                Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
                f"node(s) didn't satisfy plugin(s) [{' '.join(sorted(narrowing))}]",
            )

        if restrict_to is not None:
            outside = np.ones(n, dtype=np.bool_)
            for name in restrict_to:
                row = snapshot.index_of(name)
                if row is not None:
                    outside[row] = False
            rejected_by[candidates & outside] = ABSENT
            candidates &= ~outside
            if absent is None:
                absent = Rejection(
                    PLAN, Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "node(s) outside the gang's plan"
                )

        records: list[FilterRecord] = []
        skip = set(skipped)
        for filter_plugin in self.plugins.filters:
            if filter_plugin.name in skip:
                continue
            if not candidates.any():
                break
            verdict = filter_plugin.filter(cycle, candidates)
            if verdict is None:
                continue
            failed = np.flatnonzero(candidates & (verdict.codes == Code.ERROR))
            if len(failed):
                reason = "; ".join(verdict.reasons_at(int(failed[0])))
                error = Rejection(filter_plugin.name, Code.ERROR, reason)
                rejected_by[:] = PREFILTER_REJECTED
                explanation = Explanation(
                    names, rejected_by, prefilter_rejection=error, skipped_filters=tuple(skipped)
                )
                return Decision(pod, None, explanation, seed)
            newly = candidates & verdict.rejected
            if newly.any():
                rejected_by[newly] = len(records)
                candidates &= ~newly
                records.append(FilterRecord(filter_plugin.name, verdict))

        feasible = np.flatnonzero(candidates)
        score_records: list[ScoreRecord] = []
        preference_records: list[PreferenceRecord] = []
        skipped_scores: list[str] = []
        totals = np.zeros(n, dtype=np.int64)
        selected: str | None = None
        annotations: dict[str, str] = {}
        volume_plan: VolumePlan | None = None
        claim_plan: ClaimPlan | None = None
        if len(feasible):
            for scorer, weight in self.plugins.scores:
                scores = scorer.score(cycle, candidates)
                if scores is None:
                    skipped_scores.append(scorer.name)
                    continue
                score_records.append(ScoreRecord(scorer.name, weight, scores))
                totals += scores * weight if weight != 1 else scores
            eligible = candidates
            for preferring in self.plugins.preferences:
                preference = preferring.prefer(cycle, eligible)
                if preference is None:
                    continue
                over = eligible & preference.passed_over
                applied = bool(over.any()) and bool((eligible & ~over).any())
                preference_records.append(PreferenceRecord(preferring.name, preference, applied))
                if applied:
                    eligible = eligible & ~over
            ranked = np.where(eligible, totals, -1)
            best = np.flatnonzero(ranked == ranked.max())
            row = best[0] if len(best) == 1 else best[random.Random(seed).randrange(len(best))]
            selected = names[int(row)]
            for annotator in self.plugins.annotators:
                annotations.update(annotator.annotate(cycle, int(row)))
            for planner in self.plugins.volume_planners:
                volume_plan = planner.volume_plan(cycle, int(row)) or volume_plan
            for claim_planner in self.plugins.claim_planners:
                claim_plan = claim_planner.claim_plan(cycle, int(row)) or claim_plan
        explanation = Explanation(
            names,
            rejected_by,
            tuple(records),
            feasible,
            tuple(score_records),
            totals,
            absent=absent,
            skipped_filters=tuple(skipped),
            skipped_scores=tuple(skipped_scores),
            preferences=tuple(preference_records),
        )
        return Decision(pod, selected, explanation, seed, annotations, volume_plan, claim_plan)


def _empty_intersection(plugins: list[str]) -> Rejection:
    """PreFilter node sets that exclude each other reject the pod (RunPreFilterPlugins)."""
    if len(plugins) == 1:
        message = f"node(s) didn't satisfy plugin {plugins[0]}"
    else:
        message = f"node(s) didn't satisfy plugin(s) [{' '.join(plugins)}] simultaneously"
    return Rejection(plugins[0], Code.UNSCHEDULABLE_AND_UNRESOLVABLE, message)


@lru_cache(maxsize=16)
def framework_for(profile: Profile) -> Framework:
    """The default-registry framework of a profile, built once."""
    return Framework(profile)


def schedule(
    snapshot: Snapshot,
    pod: Pod,
    profile: Profile = DEFAULT_PROFILE,
    seed: int = 0,
    *,
    topology: TopologyState | None = None,
    load: LoadView | None = None,
    volumes: VolumeState | None = None,
    dra: DraState | None = None,
) -> Decision:
    """Filter and score every node of ``snapshot`` for ``pod`` and pick one."""
    return framework_for(profile).schedule(
        snapshot, pod, seed=seed, topology=topology, load=load, volumes=volumes, dra=dra
    )

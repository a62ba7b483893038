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
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from scheduler.core.batch import (
    INACTIVE_SCORES,
    RERUN_FILTERS,
    RERUN_SCORES,
    STABLE_FILTERS,
    STABLE_SCORES,
    Batch,
    Memo,
    Signature,
    signature,
)
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
from scheduler.core.snapshot import BoolArray, IndexArray, Snapshot
from scheduler.core.topology.state import TopologyState
from scheduler.core.whole_domains import keep_whole
from scheduler.model.pod import Pod

if TYPE_CHECKING:
    from scheduler.core.dra.search import DeviceSearch
    from scheduler.core.dra.state import ClaimPlan, DraState
    from scheduler.core.quota import QuotaContext
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
        pre_filters = {id(p) for p in self.plugins.pre_filters}
        self._rerun_filters = tuple(
            (p, id(p) in pre_filters) for p in self.plugins.filters if p.name in RERUN_FILTERS
        )
        self._rerun_scores = tuple((p, w) for p, w in self.plugins.scores if p.name in RERUN_SCORES)

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
        batch: Batch | None = None,
        search: DeviceSearch | None = None,
        quota: QuotaContext | None = None,
    ) -> Decision:
        """``restrict_to``: consider only these nodes (a gang member re-checked against its
        plan's node or domain); the others are reported as absent, not as rejected.
        ``volumes``: the cluster's storage objects; without them pods with claims are
        refused (the volume plugins cannot judge them); ``dra``: the same for DRA objects
        and pods with resource claims. ``batch``: the controller's batching state
        (:mod:`scheduler.core.batch`): an identical pod after the last one reuses its cycle.
        ``quota``: the ElasticQuotas (CapacityScheduling); a pod of a namespace with one is
        never served from the batch memo, since the previous pod used up quota."""
        sig = signature(pod) if batch is not None and restrict_to is None else None
        if quota is not None and quota.snapshot.governs(pod.namespace):
            sig = None
        if (
            sig is not None
            and (load is None or not load.may_have_fresh())
            and (topology is None or not topology.pins_cpus_anywhere())
        ):
            assert batch is not None
            memo = batch.usable(snapshot, sig, seed)
            if memo is not None:
                cycle = Cycle(snapshot, pod, topology=topology, load=load, volumes=volumes, dra=dra)
                reused = self._from_memo(memo, cycle)
                if reused is not None:
                    batch.hits += 1
                    return reused
                batch.memo = None
                batch.misses += 1
        else:
            sig = None
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
            snapshot,
            pod,
            topology=topology,
            load=load,
            volumes=volumes,
            dra=dra,
            search=search,
            quota=quota,
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
        active_filters: list[str] = []
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
            active_filters.append(filter_plugin.name)
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
            best = self._among_ties(cycle, np.flatnonzero(ranked == ranked.max()))
            row = best[0] if len(best) == 1 else best[tie_break(seed, len(best))]
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
        if sig is not None:
            assert batch is not None
            batch.memo = _memo(
                sig,
                explanation,
                candidates,
                active_filters,
                seed,
                chosen=snapshot.index_of(selected) if selected is not None else None,
                batchable=(
                    selected is not None
                    and allowed is None
                    and restrict_to is None
                    and not annotations
                    and volume_plan is None
                    and claim_plan is None
                    and not preference_records
                ),
            )
        return Decision(pod, selected, explanation, seed, annotations, volume_plan, claim_plan)

    def _among_ties(self, cycle: Cycle, best: IndexArray) -> IndexArray:
        """Rows tied for the best total, narrowed, for a pod asking for GPUs where network
        levels are set, to those that break the fewest whole domains
        (:mod:`scheduler.core.whole_domains`): a choice kube's tie-break makes blindly."""
        profile = self.profile
        if len(best) < 2 or not profile.domain_levels:
            return best
        resources = profile.gpu_placement.resources
        if not _asks_gpus(cycle.pod, resources):
            return best
        return keep_whole(cycle.snapshot, profile.domain_levels, resources, best)

    def _from_memo(self, memo: Memo, cycle: Cycle) -> Decision | None:
        """The cycle of a pod identical to the last one, from its memo (see
        :mod:`scheduler.core.batch`); None: the full cycle must run."""
        candidates = memo.candidates
        for plugin, has_pre_filter in self._rerun_filters:
            if plugin.name in memo.skipped_filters:
                continue
            if has_pre_filter:
                pre = plugin.pre_filter(cycle)  # type: ignore[attr-defined]
                if pre.code is not Code.SUCCESS or pre.node_names is not None:
                    return None
            verdict = plugin.filter(cycle, candidates)
            if verdict is not None and (verdict.rejected & candidates).any():
                return None  # the node taken is now full (or more changed than we know)
        totals = memo.totals.copy()
        records = list(memo.scores)
        by_name = {r.plugin: i for i, r in enumerate(records)}
        for scorer, weight in self._rerun_scores:
            scores = scorer.score(cycle, candidates)
            at = by_name.get(scorer.name)
            if scores is None or at is None:
                if scores is None and at is None:
                    continue
                return None
            old = records[at]
            totals += (scores - old.scores) * weight
            records[at] = ScoreRecord(scorer.name, weight, scores)
        ranked = np.where(candidates, totals, -1)
        best = self._among_ties(cycle, np.flatnonzero(ranked == ranked.max()))
        chosen = best[0] if len(best) == 1 else best[tie_break(memo.seed, len(best))]
        memo.scores = tuple(records)
        memo.totals = totals
        memo.row = int(chosen)
        memo.generation = None
        explanation = Explanation(
            memo.node_names,
            memo.rejected_by,
            memo.filters,
            np.flatnonzero(candidates),
            memo.scores,
            totals,
            skipped_filters=memo.skipped_filters,
            skipped_scores=memo.skipped_scores,
        )
        return Decision(cycle.pod, memo.node_names[int(chosen)], explanation, memo.seed)


def _memo(
    sig: Signature,
    explanation: Explanation,
    candidates: BoolArray,
    active_filters: list[str],
    seed: int,
    *,
    chosen: int | None,
    batchable: bool,
) -> Memo | None:
    """What the next identical pod may reuse of this full cycle (None: nothing, since a
    plugin whose result the assumed pod could change took part)."""
    if not batchable or chosen is None:
        return None
    if any(name not in STABLE_FILTERS and name not in RERUN_FILTERS for name in active_filters):
        return None
    if any(
        r.plugin not in STABLE_SCORES and r.plugin not in RERUN_SCORES for r in explanation.scores
    ):
        return None
    allowed_out = STABLE_SCORES | RERUN_SCORES | INACTIVE_SCORES
    if any(name not in allowed_out for name in explanation.skipped_scores):
        return None
    return Memo(
        sig,
        seed,
        explanation.node_names,
        explanation.rejected_by,
        explanation.filters,
        candidates,
        explanation.scores,
        explanation.totals,
        explanation.skipped_filters,
        explanation.skipped_scores,
        chosen,
    )


def _asks_gpus(pod: Pod, resources: Sequence[str]) -> bool:
    requests = pod.resources.requests
    return any(requests.get(r, 0) > 0 for r in resources)


@lru_cache(maxsize=4096)
def tie_break(seed: int, ties: int) -> int:
    """Which of ``ties`` equally scored rows wins: ``random.Random(seed)``'s first draw,
    remembered (seeding a generator costs more than the rest of a batched cycle)."""
    return random.Random(seed).randrange(ties)


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
    quota: QuotaContext | None = None,
) -> Decision:
    """Filter and score every node of ``snapshot`` for ``pod`` and pick one."""
    return framework_for(profile).schedule(
        snapshot,
        pod,
        seed=seed,
        topology=topology,
        load=load,
        volumes=volumes,
        dra=dra,
        quota=quota,
    )

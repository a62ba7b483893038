"""DefaultPreemption (kube-scheduler 1.34's PostFilter): which lower-priority pods to evict
so that a pod that fits nowhere fits somewhere, and on which node.

Theory of operation, following ``pkg/scheduler/framework/preemption`` and
``plugins/defaultpreemption``:

1. **Eligibility** (:func:`ineligible_reason`): ``preemptionPolicy: Never`` never preempts;
   a pod already nominated to a node where a lower-priority pod is terminating *by
   preemption* waits for it (unless that node is now UnschedulableAndUnresolvable).
2. **Potential nodes**: only nodes the failed cycle rejected as Unschedulable;
   UnschedulableAndUnresolvable means no eviction can help.
3. **Screen, vectorised**: over all potential nodes at once, would the pod's requests and
   one pod slot fit if *every* lower-priority pod were gone (and the nominated pods of at
   least its priority were there)? And could the domain of each of the pod's required
   anti-affinity terms be emptied by the node's own lower-priority pods leaving? Both are
   monotone in the pods removed, so a node failing them cannot be a candidate; only the
   survivors are simulated.
4. **Dry run** (``SelectVictimsOnNode``) per survivor, from a seeded offset (kube draws it at
   random) until ``max(10 %, 100)`` candidates are found: remove every lower-priority pod
   from the snapshot (and the device ledger, and the users of claims: a victim's
   ReadWriteOncePod claim is free for the pod, as kube's RemovePod makes it), check the pod
   passes *all* filters, then reprieve victims one by one - PDB-violating first, then the
   others, each group most important first (higher priority, then earlier start) - keeping
   a pod back whenever the pod still fits with it. The snapshot, the ledger and the claims'
   users are restored exactly afterwards, pods in their old order.
   When only counts can change as pods leave (:func:`counted_path`: requests and pod
   slots, and the pod's own required anti-affinity; no ports, hard spread, required
   affinity, devices or load thresholds in play), the same loop runs on integer sums
   instead of filter calls, which is what keeps 5000 full nodes cheap: every filter call
   costs a pass over all nodes.
5. **Pick** (``pickOneNodeForPreemption``): fewest PDB violations, lowest highest-victim
   priority, smallest sum of ``priority + 2**31`` (so negative priorities still add up),
   fewest victims, latest earliest-start among the highest-priority victims, then the first
   in dry-run order. :attr:`Preemption.tied` lists the nodes equal at every criterion (kube
   takes one of them at random, by Go map order).

**Gangs** (not in kube): a pod placed as a member of a gang (:attr:`Inputs.gangs`) is evicted
with every other placed member of its gang, on whatever node they run, or not at all. The
gang is one *unit*: a victim only if every member's priority is below the preemptor's; put
back (reprieved) and taken out together on the node examined; ordered by its members'
highest priority and earliest start; PodDisruptionBudgets spent for every member, the unit
violating when any member does. The candidate's victims list all members, so the pick's
criteria (count, priority sum) see the whole cost. Without gangs every unit is one pod and
the evaluation is kube's, step for step.

Filters run with kube's ``RunFilterPluginsWithNominatedPods``: first with the nominated pods
of priority >= the pod's added on the node, then, if any were added, without them; the pod
must pass both. What the snapshot does not carry about pods (start time, the
``DisruptionTarget`` condition, ``preemptionPolicy``) comes in :class:`PodFacts`.

Pure: the snapshot is mutated during the call and restored before it returns.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from scheduler.core.dra.extended import SINCE_MINOR as DRA_EXTENDED_SINCE
from scheduler.core.dra.objects import DeviceId
from scheduler.core.dra.search import DeviceSearch
from scheduler.core.dra.state import DraState
from scheduler.core.explain import Decision
from scheduler.core.framework import Code, Cycle
from scheduler.core.load import LoadView
from scheduler.core.nominated import nominee_devices_held
from scheduler.core.plugins.inter_pod_affinity import required_state
from scheduler.core.profile import DYNAMIC_RESOURCES, INTER_POD_AFFINITY, NODE_RESOURCES_FIT
from scheduler.core.reclaim import QUOTA_PLUGINS, Ledger, Quotas, Rules
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import BoolArray, IntArray, Snapshot
from scheduler.core.topology.state import TopologyState
from scheduler.core.volumes import VolumeState
from scheduler.graph.terms import TermKey
from scheduler.model.names import CPU, EPHEMERAL_STORAGE, MEMORY, is_extended_resource
from scheduler.model.pdb import PodDisruptionBudget
from scheduler.model.pod import Pod
from scheduler.model.pod_facts import PodFacts, PreemptionPolicy

PRIORITY_OFFSET: Final = 2**31
"""``math.MaxInt32 + 1``, added per victim to the priority sum so negatives count up."""
MIN_CANDIDATES_PERCENT: Final = 10
MIN_CANDIDATES_ABSOLUTE: Final = 100
NEVER_MESSAGE: Final = "not eligible due to preemptionPolicy=Never."
TERMINATING_MESSAGE: Final = "not eligible due to a terminating pod on the nominated node."
NO_VICTIMS_MESSAGE: Final = "No preemption victims found for incoming pod"
QUOTA_MESSAGE: Final = "the pod's ElasticQuota would not admit it with the victims gone"
NOT_HELPFUL_MESSAGE: Final = "Preemption is not helpful for scheduling"


NO_FACTS: Final = PodFacts()


@dataclass(frozen=True, slots=True)
class Candidate:
    """A node where evicting ``victims`` (most important first) makes the pod fit."""

    node: str
    victims: tuple[Pod, ...]
    pdb_violations: int


@dataclass(frozen=True)
class Preemption:
    """The chosen candidate, and what the choice was made from."""

    node: str
    victims: tuple[Pod, ...]
    pdb_violations: int
    candidates: tuple[Candidate, ...] = ()
    """Every candidate the dry run found, in dry-run order."""
    tied: tuple[str, ...] = ()
    """Candidates equal to ``node`` at every criterion (``node`` included)."""


@dataclass(frozen=True)
class Inputs:
    """Everything besides snapshot and pod that one evaluation reads."""

    pdbs: Sequence[PodDisruptionBudget] = ()
    nominated: Sequence[tuple[Pod, str]] = ()
    """Pending pods with a ``status.nominatedNodeName``, and that node."""
    facts: Mapping[str, PodFacts] = field(default_factory=dict)
    """By :attr:`Pod.key`; a missing pod has :data:`NO_FACTS`."""
    seed: int = 0
    """Seeds the dry run's starting offset (kube: ``rand.Int31n``)."""
    topology: TopologyState | None = None
    load: LoadView | None = None
    gangs: Mapping[str, str] = field(default_factory=dict)
    """Placed gang members: :attr:`Pod.key` -> gang key (``namespace/podgroup``)."""
    gang_members: Mapping[str, Sequence[Pod]] = field(default_factory=dict)
    """Gang key -> every placed member, on any node: evicted together or not at all."""
    volumes: VolumeState | None = None
    """The cluster's storage (None: pods with claims fail the dry run, as in the cycle)."""
    dra: DraState | None = None
    """The DRA objects (None: pods with resource claims fail the dry run, as in the cycle).
    Not in kube 1.34, whose DRA rejections are all UnschedulableAndUnresolvable: here a
    victim's devices count as free once it is gone, so a claim can preempt for devices."""
    search: DeviceSearch | None = None
    """One device search budget for every dry run of this PostFilter (None: each dry run
    has its own): the dry runs run on the event loop."""
    quotas: Quotas | None = None
    """The ElasticQuotas (None or none at all: kube's rules): victims are then chosen by
    reclaim's rules (:mod:`scheduler.core.reclaim`) and the quota checked with them gone."""

    def facts_of(self, pod: Pod) -> PodFacts:
        return self.facts.get(pod.key, NO_FACTS)

    def unit_key(self, pod: Pod) -> str:
        """What the pod is evicted with: its gang's key, or its own key."""
        return self.gangs.get(pod.key, pod.key)

    def unit_of(self, pod: Pod) -> tuple[Pod, ...]:
        """The pods evicted if ``pod`` is: its gang's placed members (itself included), or
        the pod alone."""
        gang = self.gangs.get(pod.key)
        if gang is None:
            return (pod,)
        members = tuple(self.gang_members.get(gang, ()))
        if not any(m.key == pod.key for m in members):
            members = (pod, *members)
        return members

    def evictable(self, pod: Pod, priority: int) -> bool:
        """Whether a preemptor of ``priority`` may evict ``pod`` (and its whole gang): the
        pod's priority and every gang member's are lower."""
        if pod.priority >= priority:
            return False
        if pod.key not in self.gangs:
            return True
        return all(m.priority < priority for m in self.unit_of(pod))


def num_candidates(potential: int) -> int:
    """``calculateNumCandidates``: 10 % of the potential nodes, at least 100, at most all."""
    n = potential * MIN_CANDIDATES_PERCENT // 100
    return min(max(n, MIN_CANDIDATES_ABSOLUTE), potential)


def more_important_key(pod: Pod, facts: PodFacts) -> tuple[int, float]:
    """Sort key of ``MoreImportantPod``: higher priority, then earlier start, first."""
    return (-pod.priority, facts.start_key)


Unit = tuple[Pod, ...]
"""Pods evicted together: one pod, or a gang's placed members (most important first)."""


def unit_importance(unit: Unit, inputs: Inputs) -> tuple[int, float]:
    """``MoreImportantPod`` for a unit: its highest priority, then its earliest start; for
    one pod exactly :func:`more_important_key`."""
    return (
        -max(p.priority for p in unit),
        min(inputs.facts_of(p).start_key for p in unit),
    )


def units_on_node(pods: Sequence[Pod], inputs: Inputs) -> list[tuple[Unit, list[Pod]]]:
    """``pods`` (evictable pods of one node) grouped by unit, in first-seen order: each
    unit's members (every node) and those among ``pods``. Without gangs, one per pod."""
    if not inputs.gangs:
        return [((p,), [p]) for p in pods]
    grouped: dict[str, tuple[Unit, list[Pod]]] = {}
    for p in pods:
        key = inputs.unit_key(p)
        if key not in grouped:
            members = inputs.unit_of(p)
            order = sorted(members, key=lambda m: more_important_key(m, inputs.facts_of(m)))
            grouped[key] = (tuple(order), [])
        grouped[key][1].append(p)
    return list(grouped.values())


def reclaim_rules(pod: Pod, inputs: Inputs) -> Rules | None:
    """Reclaim's rules for ``pod`` when quotas exist, else None (kube's rules)."""
    quotas = inputs.quotas
    if quotas is None or not quotas.active:
        return None
    return Rules.of(quotas, pod, inputs.nominated)


def ineligible_reason(
    snapshot: Snapshot, pod: Pod, decision: Decision, inputs: Inputs
) -> str | None:
    """``PodEligibleToPreemptOthers``: None when the pod may preempt, else kube's message.
    With quotas, the pod waits for a pod terminating by preemption on its nominated node
    that reclaim's rules would have let it evict (CapacityScheduling's variant)."""
    if inputs.facts_of(pod).preemption_policy is PreemptionPolicy.NEVER:
        return NEVER_MESSAGE
    nominated = pod.nominated_node_name
    if not nominated:
        return None
    explanation = decision.explanation
    if nominated in explanation.node_names:
        at = explanation.node_names.index(nominated)
        if int(explanation.node_codes[at]) == Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
            return None
    row = snapshot.index_of(nominated)
    if row is None:
        return None
    rules = reclaim_rules(pod, inputs)
    for other in snapshot.pods_on(row):
        if not inputs.facts_of(other).terminating_by_preemption:
            continue
        if rules.could_take(other) if rules is not None else other.priority < pod.priority:
            return TERMINATING_MESSAGE
    return None


def potential_nodes(snapshot: Snapshot, decision: Decision) -> list[str]:
    """Nodes the failed cycle rejected as Unschedulable, in snapshot row order."""
    explanation = decision.explanation
    codes = {
        name: int(code)
        for name, code in zip(explanation.node_names, explanation.node_codes.tolist(), strict=True)
    }
    return [n for n in snapshot.node_names if codes.get(n) == Code.UNSCHEDULABLE]


def pick_one(
    candidates: Sequence[Candidate], inputs: Inputs, rules: Rules | None = None
) -> tuple[Candidate, list[Candidate]]:
    """``pickOneNodeForPreemption``'s criteria in order; the first of the best, and all tied.
    With fair share on, right after PDB violations: the candidate whose victims' quotas are
    all furthest above their fair share (the smallest excess among its victims, largest)."""
    remaining = list(candidates)
    criteria = _criteria(inputs)
    if rules is not None and rules.fair:
        fair = rules

        def least_excess(c: Candidate) -> float:
            return float(min(fair.excess(v.namespace) for v in c.victims))

        criteria.insert(1, least_excess)
    for score in criteria:
        scores = [score(c) for c in remaining]
        best = max(scores)
        remaining = [c for c, s in zip(remaining, scores, strict=True) if s == best]
        if len(remaining) == 1:
            break
    return remaining[0], remaining


def _criteria(inputs: Inputs) -> list[Callable[[Candidate], float]]:
    def earliest_top_start(c: Candidate) -> float:
        top = max(v.priority for v in c.victims)
        return min(inputs.facts_of(v).start_key for v in c.victims if v.priority == top)

    return [
        lambda c: -c.pdb_violations,
        lambda c: -max(v.priority for v in c.victims),
        lambda c: -sum(v.priority + PRIORITY_OFFSET for v in c.victims),
        lambda c: -len(c.victims),
        earliest_top_start,
    ]


def split_by_pdb(
    pods: Sequence[Pod], pdbs: Sequence[PodDisruptionBudget]
) -> tuple[list[Pod], list[Pod]]:
    """``filterPodsWithPDBViolation``: spend each budget's allowance in the given order; a pod
    whose eviction takes some budget below zero is violating."""
    allowed = [pdb.disruptions_allowed for pdb in pdbs]
    violating: list[Pod] = []
    fine: list[Pod] = []
    for pod in pods:
        violated = False
        for i, pdb in enumerate(pdbs):
            if pdb.covers(pod):
                allowed[i] -= 1
                if allowed[i] < 0:
                    violated = True
        (violating if violated else fine).append(pod)
    return violating, fine


def split_units_by_pdb(
    units: Sequence[Unit], pdbs: Sequence[PodDisruptionBudget]
) -> tuple[list[tuple[Unit, int]], list[Unit]]:
    """:func:`split_by_pdb` over units in order, every member spending the budgets: the
    violating units (with how many of their members violate) and the others."""
    violating_pods, _ = split_by_pdb([p for u in units for p in u], pdbs)
    flagged = {p.key for p in violating_pods}
    violating: list[tuple[Unit, int]] = []
    fine: list[Unit] = []
    for unit in units:
        n = sum(1 for p in unit if p.key in flagged)
        if n:
            violating.append((unit, n))
        else:
            fine.append(unit)
    return violating, fine


def select_victims(
    victims_in_order: Sequence[Unit],
    pdbs: Sequence[PodDisruptionBudget],
    fits_with: Callable[[int], bool],
    drop: Callable[[int], None],
    importance: Callable[[Unit], tuple[float, ...]],
) -> tuple[list[Pod], int]:
    """The reprieve loop of ``SelectVictimsOnNode`` over units already removed and sorted
    most important first: ``fits_with(i)`` puts unit ``i`` back and says whether the pod
    still fits; ``drop(i)`` takes it out again; ``importance`` is the sort key. Returns
    (victims most important first, violations); kube's sort is not stable, so equals may
    come in any order. A unit of one pod each is kube's loop exactly."""
    index = {id(u): i for i, u in enumerate(victims_in_order)}
    violating, fine = split_units_by_pdb(victims_in_order, pdbs)
    chosen: list[Unit] = []
    violations = 0
    groups: tuple[list[tuple[Unit, int]], list[tuple[Unit, int]]] = (
        violating,
        [(u, 0) for u in fine],
    )
    for group in groups:
        for unit, counts in group:
            i = index[id(unit)]
            if not fits_with(i):
                drop(i)
                chosen.append(unit)
                violations += counts
    if violating and fine:
        chosen.sort(key=importance)
    return [p for unit in chosen for p in unit], violations


class _Victims:
    """Which pods of a node may go for the pod: kube's rule (lower priority; a gang whole),
    or reclaim's (:class:`~scheduler.core.reclaim.Rules`) with a ledger of the quotas' use
    that follows the victims out and back."""

    def __init__(self, pod: Pod, inputs: Inputs) -> None:
        self.pod = pod
        self.inputs = inputs
        self.rules = reclaim_rules(pod, inputs)

    def potential(self, pods: Sequence[Pod]) -> list[Pod]:
        """The node's potential victims (``pods``: all of the node's), in node order. Under
        reclaim, taken least important first, each unit while the rules still allow it."""
        inputs, rules = self.inputs, self.rules
        if rules is None:
            return [p for p in pods if inputs.evictable(p, self.pod.priority)]
        ledger = rules.ledger()
        units = units_on_node(pods, inputs)
        order = sorted(
            range(len(units)), key=lambda i: unit_importance(units[i][0], inputs), reverse=True
        )
        taken: set[int] = set()
        for i in order:
            if rules.may_take(units[i][0], ledger):
                ledger.take(units[i][0])
                taken.add(i)
        return [p for i, (_, on_node) in enumerate(units) if i in taken for p in on_node]

    def ledger_without(self, units: Sequence[Unit]) -> Ledger | None:
        """The quotas' use with every unit gone (None: no quotas)."""
        if self.rules is None:
            return None
        ledger = self.rules.ledger()
        for unit in units:
            ledger.take(unit)
        return ledger

    def admits(self, ledger: Ledger | None) -> bool:
        return ledger is None or self.rules is None or self.rules.admits(ledger)

    def order(self, unit: Unit) -> tuple[float, int, float]:
        """The reprieve order (kept first): kube's importance; with fair share, the units of
        quotas nearest their fair share first, so the furthest above gives first."""
        importance = unit_importance(unit, self.inputs)
        rules = self.rules
        excess = float(rules.excess(unit[0].namespace)) if rules is not None and rules.fair else 0.0
        return (excess, *importance)


class _Simulation:
    """Removes and restores pods of one node in the snapshot, the device ledger and the
    claims' users (kube's RemovePod/AddPod: VolumeRestrictions then sees a victim's
    ReadWriteOncePod claim free)."""

    def __init__(self, framework: Framework, snapshot: Snapshot, pod: Pod, inputs: Inputs):
        self.framework = framework
        self.snapshot = snapshot
        self.pod = pod
        self.inputs = inputs
        self.nominated: dict[str, list[Pod]] = {}
        self.unledgered: dict[str, Pod] = {}
        """Pods taken out of the device ledger, to put back on restore."""
        self.unclaimed: dict[str, Pod] = {}
        """Pods taken out of the claims' users, to put back on restore."""
        self.freed: dict[str, list[DeviceId]] = {}
        """DRA devices of removed pods, counted free until put back."""
        self.victims = _Victims(pod, inputs)
        self.ledger: Ledger | None = None
        """The quotas' use with the node's current victims gone (reclaim only)."""
        for other, node in inputs.nominated:
            if other.priority >= pod.priority and other.key != pod.key:
                self.nominated.setdefault(node, []).append(other)

    def remove(self, pod: Pod) -> None:
        self.snapshot.remove_pod(pod)
        if self.inputs.topology is not None:
            self.inputs.topology.pod_removed(pod.key)
            self.unledgered[pod.key] = pod
        if self.inputs.volumes is not None and pod.storage_volumes:
            self.inputs.volumes.remove_pod(pod.key)
            self.unclaimed[pod.key] = pod
        dra = self.inputs.dra
        # A pod's own claims, and the claim made for its extended resources, if any.
        claims = pod.resource_claims or pod.container_requests
        if dra is not None and claims and pod.key not in self.freed:
            devices = dra.held_by(pod.uid)
            dra.release(devices)
            self.freed[pod.key] = devices

    def add(self, pod: Pod, node: str) -> None:
        self.snapshot.add_pod(pod, node)
        if self.inputs.topology is not None:
            self.inputs.topology.pod_placed(pod, node, pod.annotations)
            self.unledgered.pop(pod.key, None)
        if self.unclaimed.pop(pod.key, None) is not None and self.inputs.volumes is not None:
            self.inputs.volumes.add_pod(pod)
        devices = self.freed.pop(pod.key, None)
        if devices is not None and self.inputs.dra is not None:
            self.inputs.dra.hold(devices)

    def restore(self, node: str, original: Sequence[Pod]) -> None:
        """Put the node's pods back in their original order (pod order is observable)."""
        row = self.snapshot.index_of(node)
        assert row is not None
        for pod in list(self.snapshot.pods_on(row)):
            self.snapshot.remove_pod(pod)
        for pod in original:
            self.snapshot.add_pod(pod, node)
        if self.inputs.topology is not None:
            for pod in self.unledgered.values():
                self.inputs.topology.pod_placed(pod, node, pod.annotations)
        self.unledgered.clear()
        if self.inputs.volumes is not None:
            for pod in self.unclaimed.values():
                self.inputs.volumes.add_pod(pod)
        self.unclaimed.clear()
        if self.inputs.dra is not None:
            for devices in self.freed.values():
                self.inputs.dra.hold(devices)
        self.freed.clear()

    def failure(self, node: str) -> tuple[str, ...] | None:
        """``RunFilterPluginsWithNominatedPods`` on one node of the current snapshot: None
        when the pod passes with the nominated pods and (if any) without them."""
        fw, snap, pod, inputs = self.framework, self.snapshot, self.pod, self.inputs
        extra = self.nominated.get(node, [])
        if not extra:
            return filter_failure(fw, snap, pod, node, inputs)
        for other in extra:
            snap.add_pod(other, node)
        try:
            with_nominated = filter_failure(fw, snap, pod, node, inputs)
        finally:
            for other in extra:
                snap.remove_pod(other)
        return with_nominated or filter_failure(fw, snap, pod, node, inputs)

    def fits(self, node: str) -> bool:
        return self.victims.admits(self.ledger) and self.failure(node) is None

    def status_on(self, node: str) -> tuple[str, ...] | None:
        """Why ``node`` is no candidate (the dry run's status), None if it is one."""
        row = self.snapshot.index_of(node)
        assert row is not None
        original = list(self.snapshot.pods_on(row))
        lower = self.victims.potential(original)
        if not lower:
            return (NO_VICTIMS_MESSAGE,)
        for victim in lower:
            self.remove(victim)
        try:
            failure = self.failure(node)
            ledger = self.victims.ledger_without([u for u, _ in units_on_node(lower, self.inputs)])
            if failure is None and not self.victims.admits(ledger):
                return (QUOTA_MESSAGE,)
            return failure
        finally:
            self.restore(node, original)

    def select_on(self, node: str) -> Candidate | None:
        row = self.snapshot.index_of(node)
        assert row is not None
        original = list(self.snapshot.pods_on(row))
        inputs = self.inputs
        chooser = self.victims
        lower = chooser.potential(original)
        if not lower:
            return None
        for victim in lower:
            self.remove(victim)
        units = sorted(units_on_node(lower, inputs), key=lambda u: chooser.order(u[0]))
        self.ledger = chooser.ledger_without([u for u, _ in units])
        try:
            if not self.fits(node):
                return None

            def fits_with(i: int) -> bool:
                for victim in units[i][1]:
                    self.add(victim, node)
                if self.ledger is not None:
                    self.ledger.give(units[i][0])
                return self.fits(node)

            def drop(i: int) -> None:
                for victim in units[i][1]:
                    self.remove(victim)
                if self.ledger is not None:
                    self.ledger.take(units[i][0])

            victims, violations = select_victims(
                [u for u, _ in units], inputs.pdbs, fits_with, drop, chooser.order
            )
        finally:
            self.ledger = None
            self.restore(node, original)
        if not victims:
            return None
        return Candidate(node, tuple(victims), violations)


def filter_failure(
    framework: Framework, snapshot: Snapshot, pod: Pod, node: str, inputs: Inputs
) -> tuple[str, ...] | None:
    """None when ``pod`` passes every PreFilter and Filter of the profile on ``node``, else
    the reasons of the first plugin that rejects it (kube's status reasons).

    The same loop as :meth:`Framework.schedule` without scoring and explanations.
    """
    row = snapshot.index_of(node)
    if row is None:
        return ("node not found",)
    cycle = Cycle(
        snapshot,
        pod,
        topology=inputs.topology,
        load=inputs.load,
        volumes=inputs.volumes,
        dra=inputs.dra,
        search=inputs.search,
    )
    skipped: set[str] = set()
    for plugin in framework.plugins.pre_filters:
        if plugin.name in QUOTA_PLUGINS:
            continue  # the dry run's quota check is reclaim's ledger (Rules.admits)
        result = plugin.pre_filter(cycle)
        if result.code is Code.SKIP:
            skipped.add(plugin.name)
            continue
        if result.rejected:
            return (result.message,)
        if result.node_names is not None and node not in result.node_names:
            return (f"node(s) didn't satisfy plugin {plugin.name}",)
    candidates = np.zeros(snapshot.num_nodes, dtype=np.bool_)
    candidates[row] = True
    for filter_plugin in framework.plugins.filters:
        if filter_plugin.name in skipped:
            continue
        verdict = filter_plugin.filter(cycle, candidates)
        if verdict is not None and verdict.codes[row] != 0:
            return tuple(verdict.reasons_at(row))
    return None


POD_INDEPENDENT_FILTERS: Final = frozenset(
    {"Unsupported", "NodeUnschedulable", "NodeName", "TaintToleration", "NodeAffinity"}
)
"""Filters whose verdict on a node does not depend on the pods placed there."""


def counted_path(framework: Framework, snapshot: Snapshot, pod: Pod, inputs: Inputs) -> bool:
    """Whether counts decide the fit as pods leave a node: NodeResourcesFit's sums, and the
    pod's own required anti-affinity terms (pods selected per domain).

    True when every other filter is pod-independent or skips this pod (no host ports, no
    hard spread, no required affinity, no existing pod's anti-affinity selecting it, no
    devices, no load thresholds), and no nominated pod could bring an anti-affinity term
    along. Skips only get likelier as pods are removed, so the original snapshot decides.
    """
    if any(other.has_required_anti_affinity for other, _ in inputs.nominated):
        return False
    cycle = Cycle(
        snapshot,
        pod,
        topology=inputs.topology,
        load=inputs.load,
        volumes=inputs.volumes,
        dra=inputs.dra,
        search=inputs.search,
    )
    with_pre_filter: set[str] = set()
    for plugin in framework.plugins.pre_filters:
        with_pre_filter.add(plugin.name)
        if (
            plugin.name in POD_INDEPENDENT_FILTERS
            or plugin.name == NODE_RESOURCES_FIT
            or plugin.name in QUOTA_PLUGINS
        ):
            continue
        if (
            plugin.name == INTER_POD_AFFINITY
            and not pod.required_affinity
            and not required_state(snapshot.affinity_graph, pod).existing_anti_affinity_counts
        ):
            continue
        if plugin.pre_filter(cycle).code is not Code.SKIP:
            return False
    return all(
        f.name in with_pre_filter or f.name in POD_INDEPENDENT_FILTERS
        for f in framework.plugins.filters
    )


class _Room:
    """NodeResourcesFit's accounting for one pod: the vectorised screen over all potential
    nodes, and the whole victim selection in integer arithmetic when :func:`counted_path`.
    """

    def __init__(self, framework: Framework, snapshot: Snapshot, pod: Pod, inputs: Inputs):
        self.snapshot = snapshot
        self.pod = pod
        self.inputs = inputs
        self.victims = _Victims(pod, inputs)
        self._potential: dict[int, list[Pod]] = {}
        self.checked = NODE_RESOURCES_FIT in framework.profile.filters
        self.anti_terms = (
            [TermKey.of_affinity(t) for t in pod.required_anti_affinity]
            if INTER_POD_AFFINITY in framework.profile.filters
            else []
        )
        self.checks: list[tuple[str, int | None, int]] = []
        """(resource, snapshot column or None, amount) the filter compares."""
        self.delegable: set[str] = set()
        """Checked resources a DeviceClass serves: on nodes without them in allocatable,
        DynamicResources decides, not NodeResourcesFit (DRAExtendedResource)."""
        if self.checked:
            args = framework.profile.node_resources_fit
            dra = inputs.dra
            profile = framework.profile
            extended = (
                profile.kube_minor >= DRA_EXTENDED_SINCE and DYNAMIC_RESOURCES in profile.filters
            )
            for name, amount in pod.resources.requests.items():
                if amount <= 0:
                    continue
                if is_extended_resource(name) and name not in (CPU, MEMORY, EPHEMERAL_STORAGE):
                    group = name.split("/", 1)[0]
                    if name in args.ignored_resources or group in args.ignored_resource_groups:
                        continue
                if (
                    extended
                    and dra is not None
                    and pod.container_requests
                    and dra.extended_class(name) is not None
                ):
                    self.delegable.add(name)
                self.checks.append((name, snapshot.resource_column(name), amount))
        n = snapshot.num_nodes
        self.index = {r: i for i, r in enumerate(snapshot.resource_names)}
        self.added = np.zeros((len(self.index), n), dtype=np.int64)
        self.added_count = np.zeros(n, dtype=np.int64)
        self.nominated_on: dict[str, list[Pod]] = {}
        for other, node in inputs.nominated:
            row = snapshot.index_of(node)
            if row is None or other.priority < pod.priority or other.key == pod.key:
                continue
            self.nominated_on.setdefault(node, []).append(other)
            self.added_count[row] += 1
            for name, amount in other.resources.accounted.items():
                col = self.index.get(name)
                if col is not None:
                    self.added[col, row] += amount

    def potential(self, row: int) -> list[Pod]:
        """The row's potential victims (:meth:`_Victims.potential`), computed once."""
        found = self._potential.get(row)
        if found is None:
            found = self.victims.potential(list(self.snapshot.pods_on(row)))
            self._potential[row] = found
        return found

    def screen(self, rows: Sequence[int]) -> BoolArray:
        """Per entry of ``rows``: could the pod's requests and a pod slot fit with every
        lower-priority pod removed (and the nominated pods of >= priority added)? False
        where there is no lower-priority pod at all. Vectorised over nodes."""
        snapshot = self.snapshot
        n = snapshot.num_nodes
        lower_count = np.zeros(n, dtype=np.int64)
        freed = np.zeros((len(self.index), n), dtype=np.int64)
        for row in rows:
            for other in self.potential(row):
                lower_count[row] += 1
                for name, amount in other.resources.accounted.items():
                    freed[self.index[name], row] += amount
        ok = lower_count > 0
        if self.checked:
            slots = snapshot.pod_counts - lower_count + self.added_count + 1
            ok &= slots <= snapshot.allowed_pods
            used: IntArray = snapshot.requested - freed + self.added
            for name, col, amount in self.checks:
                delegable = name in self.delegable
                if col is None:
                    if delegable:
                        continue
                    ok[:] = False
                    break
                alloc = snapshot.allocatable[col]
                fits = amount <= alloc - used[col]
                ok &= (fits | (alloc <= 0)) if delegable else fits
        ok &= self._anti_affinity_clears(rows)
        return np.asarray(ok[np.asarray(rows, dtype=np.intp)], dtype=np.bool_)

    def _staying(self, row: int, key: TermKey, by_domain: Mapping[str, int]) -> int | None:
        """Pods ``key`` selects that stay in the node's domain when the node's lower-priority
        pods leave and its nominated pods arrive; None when the node lacks the key."""
        snapshot = self.snapshot
        column = snapshot.label_column(key.topology_key)
        vid = -1 if column is None else int(column.ids[row])
        if column is None or vid < 0:
            return None
        graph = snapshot.affinity_graph
        staying = by_domain.get(column.values[vid], 0)
        for other in self.potential(row):
            if graph.selects_pod(key, other):
                staying -= 1
        for other in self.nominated_on.get(snapshot.node_names[row], ()):
            if graph.selects_pod(key, other):
                staying += 1
        return staying

    def _anti_affinity_clears(self, rows: Sequence[int]) -> BoolArray:
        """Nodes where removing the lower-priority pods could empty the domain of every
        required anti-affinity term of the pod (kube's filter rejects a node whose domain
        has a pod the term selects). Only the node's own pods leave, so every selected pod
        elsewhere in the domain, or of higher priority, or nominated there, stays."""
        ok = np.ones(self.snapshot.num_nodes, dtype=np.bool_)
        graph = self.snapshot.affinity_graph
        for key in self.anti_terms:
            by_domain = dict(graph.term_counts(key).by_domain)
            for row in rows:
                staying = self._staying(row, key, by_domain)
                if staying is not None and staying > 0:
                    ok[row] = False
        return ok

    def select_on(self, node: str) -> Candidate | None:
        """``SelectVictimsOnNode`` when counts decide (:func:`counted_path`): sums of requests
        and of pods the anti-affinity terms select, instead of filter calls."""
        snapshot, inputs = self.snapshot, self.inputs
        row = snapshot.index_of(node)
        assert row is not None
        lower = self.potential(row)
        if not lower or any(col is None for _, col, _ in self.checks):
            return None
        chooser = self.victims
        units = sorted(units_on_node(lower, inputs), key=lambda u: chooser.order(u[0]))
        ledger = chooser.ledger_without([u for u, _ in units])
        cols = [(name, col, amount) for name, col, amount in self.checks if col is not None]
        alloc = [int(snapshot.allocatable[col, row]) for _, col, _ in cols]
        used = [
            int(snapshot.requested[col, row])
            - sum(p.resources.accounted.get(name, 0) for p in lower)
            + int(self.added[col, row])
            for name, col, _ in cols
        ]
        count = [int(snapshot.pod_counts[row]) - len(lower) + int(self.added_count[row])]
        allowed = int(snapshot.allowed_pods[row])
        graph = snapshot.affinity_graph
        anti: list[tuple[TermKey, int]] = []
        for key in self.anti_terms:
            staying = self._staying(row, key, graph.term_counts(key).by_domain)
            if staying is not None:
                anti.append((key, staying))
        staying_now = [n for _, n in anti]

        def fits() -> bool:
            if not chooser.admits(ledger):
                return False
            if self.checked and count[0] + 1 > allowed:
                return False
            if any(n > 0 for n in staying_now):
                return False
            return all(u + c[2] <= a for u, c, a in zip(used, cols, alloc, strict=True))

        def shift(victim: Pod, sign: int) -> None:
            count[0] += sign
            for i, (name, _, _) in enumerate(cols):
                used[i] += sign * victim.resources.accounted.get(name, 0)
            for i, (key, _) in enumerate(anti):
                if graph.selects_pod(key, victim):
                    staying_now[i] += sign

        if not fits():
            return None

        def fits_with(i: int) -> bool:
            for victim in units[i][1]:
                shift(victim, +1)
            if ledger is not None:
                ledger.give(units[i][0])
            return fits()

        def drop(i: int) -> None:
            for victim in units[i][1]:
                shift(victim, -1)
            if ledger is not None:
                ledger.take(units[i][0])

        victims, violations = select_victims(
            [u for u, _ in units], inputs.pdbs, fits_with, drop, chooser.order
        )
        if not victims:
            return None
        return Candidate(node, tuple(victims), violations)


def preempt(
    framework: Framework,
    snapshot: Snapshot,
    decision: Decision,
    inputs: Inputs | None = None,
    *,
    force_simulation: bool = False,
) -> Preemption | None:
    """DefaultPreemption for ``decision.pod`` after ``decision`` found no node.

    None when the pod is not eligible or no node can be freed for it; otherwise the node to
    nominate and the pods to evict there (most important first). ``force_simulation`` runs
    the filters even where integer sums would do (tests compare the two).
    """
    inputs = inputs or Inputs()
    with nominee_devices_held(framework, snapshot, decision.pod, inputs.nominated, inputs.dra):
        return _preempt(framework, snapshot, decision, inputs, force_simulation)


def _preempt(
    framework: Framework,
    snapshot: Snapshot,
    decision: Decision,
    inputs: Inputs,
    force_simulation: bool,
) -> Preemption | None:
    pod = decision.pod
    if ineligible_reason(snapshot, pod, decision, inputs) is not None:
        return None
    names = potential_nodes(snapshot, decision)
    rules = reclaim_rules(pod, inputs)
    if not names or (rules is None and not snapshot.has_priority_below(pod.priority)):
        return None
    rows = [snapshot.index_of(name) for name in names]
    room = _Room(framework, snapshot, pod, inputs)
    survivors = room.screen([r for r in rows if r is not None])
    alive = {name for name, keep in zip(names, survivors.tolist(), strict=True) if keep}
    if not alive:
        return None
    if not force_simulation and counted_path(framework, snapshot, pod, inputs):
        return _dry_run(names, alive, room.select_on, inputs, rules)
    # Known to the graph as pending, the pod's own terms are indexed and their counts
    # patched as victims leave and return, instead of recounted over every pod per check.
    register = snapshot.node_of_pod(pod.key) is None
    if register:
        snapshot.add_pod(pod, "")
    try:
        return _dry_run(
            names, alive, _Simulation(framework, snapshot, pod, inputs).select_on, inputs, rules
        )
    finally:
        if register:
            snapshot.remove_pod(pod)


def _dry_run(
    names: Sequence[str],
    alive: set[str],
    select: Callable[[str], Candidate | None],
    inputs: Inputs,
    rules: Rules | None = None,
) -> Preemption | None:
    """``DryRunPreemption`` then ``SelectCandidate`` over the screened potential nodes.
    Reclaim examines every node (CapacityScheduling asks for all candidates)."""
    wanted = len(names) if rules is not None else num_candidates(len(names))
    offset = random.Random(inputs.seed).randrange(len(names))
    clean: list[Candidate] = []
    violating: list[Candidate] = []
    for i in range(len(names)):
        name = names[(offset + i) % len(names)]
        if name not in alive:
            continue
        found = select(name)
        if found is None:
            continue
        bucket = violating if found.pdb_violations else clean
        if len(bucket) < wanted:  # kube's candidate lists hold at most that many each
            bucket.append(found)
        if clean and len(clean) + len(violating) >= wanted:
            break
    candidates = clean + violating
    if not candidates:
        return None
    best, tied = pick_one(candidates, inputs, rules)
    return Preemption(
        best.node,
        best.victims,
        best.pdb_violations,
        tuple(candidates),
        tuple(c.node for c in tied),
    )


def no_preemption_message(
    framework: Framework, snapshot: Snapshot, decision: Decision, inputs: Inputs | None = None
) -> str:
    """kube's PostFilter message when :func:`preempt` returns None (kube prefixes it with
    ``preemption: `` after the cycle's own FitError): the eligibility message, or a FitError
    over the dry run's per-node statuses, every node not examined counting as "Preemption
    is not helpful for scheduling". Simulates every potential node, so it is for reports,
    not for the cycle."""
    inputs = inputs or Inputs()
    pod = decision.pod
    reason = ineligible_reason(snapshot, pod, decision, inputs)
    if reason is not None:
        return reason
    counts: Counter[str] = Counter()
    examined = 0
    rules = reclaim_rules(pod, inputs)
    if rules is None and not snapshot.has_priority_below(pod.priority):
        # Nothing lower anywhere: every potential node says so without a simulation.
        examined = len(potential_nodes(snapshot, decision))
        if examined:
            counts[NO_VICTIMS_MESSAGE] = examined
        return _fit_error(snapshot.num_nodes, counts, examined)
    register = snapshot.node_of_pod(pod.key) is None
    if register:
        snapshot.add_pod(pod, "")
    try:
        with nominee_devices_held(framework, snapshot, pod, inputs.nominated, inputs.dra):
            simulation = _Simulation(framework, snapshot, pod, inputs)
            for name in potential_nodes(snapshot, decision):
                status = simulation.status_on(name)
                if status is None:
                    continue
                examined += 1
                counts.update(status)
    finally:
        if register:
            snapshot.remove_pod(pod)
    message = _fit_error(snapshot.num_nodes, counts, examined)
    return message if rules is None else rules.noted(message)


def _fit_error(num_nodes: int, counts: Counter[str], examined: int) -> str:
    """kube's FitError text over the dry run's statuses; nodes not examined count as
    "Preemption is not helpful for scheduling"."""
    absent = num_nodes - examined
    if absent:
        counts[NOT_HELPFUL_MESSAGE] += absent
    entries = sorted(f"{count} {reason}" for reason, count in counts.items())
    return f"0/{num_nodes} nodes are available: {', '.join(entries)}."

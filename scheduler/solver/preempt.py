"""Gang preemption: which lower-priority pods to evict so that a whole gang then fits.

Theory of operation (kube's ``SelectVictimsOnNode`` reprieve loop, lifted from one node to
the nodes of the gang's plan, with the plan, else the gang solve, as the fit check):

1. **Eligibility** (:func:`ineligible_reason`): no member may have ``preemptionPolicy:
   Never``; a gang with a member nominated to a node where a lower-priority pod is
   terminating by preemption waits for it (kube's rule for one pod, for every member).
2. **Priority**: the gang's preemption priority is its *lowest* member priority, so every
   victim is of lower priority than every member it makes room for.
3. **Candidate units** (:func:`candidate_units`): on the nodes where some member class is
   feasible or only Unschedulable (never UnschedulableAndUnresolvable: no eviction helps
   there), every pod :meth:`~scheduler.core.preemption.Inputs.evictable` by that priority,
   grouped into units (a placed gang is one unit, its members on every node; see
   :mod:`scheduler.core.preemption`). The preempting gang's own members are never victims.
4. **Search** (:class:`VictimSearch`, a state machine: it names the units to remove, the
   caller builds the gang's problem on the snapshot without them; the plan in hand is
   checked against that problem first (:func:`plan_fits`: its members on its nodes break
   no rule of the model), and only when it does not fit does the caller solve, with the
   configured time limit):

   a. remove every candidate unit and solve: if the gang does not fit even then, or the
      solve runs out of time, nothing is evicted;
   b. only when there are more units than :data:`MAX_REPRIEVE_TRIALS`: keep those with a
      pod on a node of that plan (step d), so that the reprieves go to the units that
      matter; when no plan fits with victims on its own nodes only, nothing is evicted;
   c. reprieve, most important first (units whose eviction would violate a
      PodDisruptionBudget first, then the others; each group by the unit's highest
      priority, then earliest start): put the unit back; if the plan in hand still fits,
      the unit is spared without a solve (the plan found with the victims removed is the
      fit check), else solve: a plan spares the unit, a proof that the gang does not fit
      keeps it a victim, and a solve that runs out of time spares it (never an eviction
      on a timeout). Among units of equal priority a gang may be tried before or after the
      single pods, and neither is always better (keeping a gang of four may cost eight
      singles, or the reverse), so with gangs among the units two passes run, larger units
      first and smaller first, from the same start, and the better result by kube's
      candidate criteria wins (fewest PDB violations, lowest highest victim priority,
      smallest priority sum, fewest victims). After :data:`MAX_REPRIEVE_TRIALS` solves in
      a pass, a unit is spared only if the plan in hand fits without it;
   d. settle each pass's result, as kube evicts only on the node it nominates: the
      victims with no pod on a node of the plan go back if the plan holds without them
      (a check, else one solve with just the others removed, whose plan settles again),
      and a plan left unconfirmed by a timeout is confirmed the same way. A pass whose
      result does not settle (a proof, or a timeout) yields nothing.

   The answer is the victims and a plan that fits with exactly those pods gone; every
   victim unit has a pod on a node of the plan (a victim gang still goes whole, its
   members wherever they run). More evictions than needed happen only on the plan's
   nodes (units past the solve budget), never off them and never because of a timeout.

**Reclaim** (:class:`QuotaGate`): a gang its ElasticQuota refuses by the sum of mins, while
its own quota stays within its min, may evict borrowers' units: a trial counts only where the
quota admits the gang with the trial's pods gone, victims need not be on the plan's nodes
(the quota rule is cluster-wide), and the reprieve puts back the units of quotas nearest
their fair share first.

:func:`problem_without` builds one trial's problem: it takes the pods out of the snapshot
(and the device ledger, and the claims' users), runs
:func:`~scheduler.solver.problem.build_problem` and puts them back in their original order.
The solve reads only the problem, so the caller may run it in a worker thread between
trials. :func:`preempt_gang` drives the whole search synchronously (tests, ``lattice
explain``).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

import numpy as np

from scheduler.core.dra.objects import DeviceId
from scheduler.core.dra.state import DraState
from scheduler.core.framework import Code
from scheduler.core.load import LoadView
from scheduler.core.preemption import (
    NEVER_MESSAGE,
    NO_VICTIMS_MESSAGE,
    PRIORITY_OFFSET,
    TERMINATING_MESSAGE,
    Inputs,
    Unit,
    split_units_by_pdb,
    unit_importance,
)
from scheduler.core.quota import add
from scheduler.core.reclaim import Rules
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.core.topology.state import TopologyState
from scheduler.core.volumes import VolumeState
from scheduler.model.gang import GangSpec
from scheduler.model.pod import Pod
from scheduler.model.pod_facts import PreemptionPolicy
from scheduler.solver.check import violations
from scheduler.solver.problem import GangProblem, build_problem
from scheduler.solver.solve import GangPlan, SolveStatus

MAX_REPRIEVE_TRIALS: Final = 32
"""Solves one reprieve pass may spend putting victims back; after them, a unit is spared
only when the plan in hand fits without it (a check, no solve)."""
NOT_HELPFUL_MESSAGE: Final = "the gang does not fit even with every lower-priority pod evicted"
TIMED_OUT_MESSAGE: Final = (
    "no placement of the gang was found in time with the lower-priority pods evicted "
    "(nothing is evicted on a timeout)"
)
OFF_PLAN_MESSAGE: Final = (
    "the gang fits only with lower-priority pods evicted on nodes it would not use"
)
UNCONFIRMED_MESSAGE: Final = (
    "no placement was confirmed in time with only the pods the reprieves left as victims "
    "(nothing is evicted on a timeout)"
)


def gang_priority(members: Sequence[Pod]) -> int:
    """The priority a gang preempts with: its lowest member's (every victim is below every
    member)."""
    return min(m.priority for m in members)


def ineligible_reason(snapshot: Snapshot, members: Sequence[Pod], inputs: Inputs) -> str | None:
    """None when the gang may preempt, else kube's message for the first member that may
    not: ``preemptionPolicy: Never``, or nominated to a node where a pod of lower priority
    than the gang is terminating by preemption."""
    if any(inputs.facts_of(m).preemption_policy is PreemptionPolicy.NEVER for m in members):
        return NEVER_MESSAGE
    priority = gang_priority(members)
    nominated = {pod.key: node for pod, node in inputs.nominated}
    for member in members:
        node = nominated.get(member.key) or member.nominated_node_name
        row = snapshot.index_of(node) if node else None
        if row is None:
            continue
        for other in snapshot.pods_on(row):
            if other.priority < priority and inputs.facts_of(other).terminating_by_preemption:
                return TERMINATING_MESSAGE
    return None


def gang_rules(members: Sequence[Pod], inputs: Inputs) -> Rules | None:
    """Reclaim's rules for a gang (None without quotas): its lowest-priority member as the
    preemptor, charged with the whole gang's request. Applied statically (each victim's
    quota as it is now, not as earlier victims leave it): a gang within its quota's min
    takes from borrowers, above it only its own quota's lower-priority pods."""
    quotas = inputs.quotas
    if quotas is None or not quotas.active or not members:
        return None
    lowest = min(members, key=lambda m: m.priority)
    request = add(*(quotas.asked(m) for m in members))
    keys = {m.key for m in members}
    others = [(p, n) for p, n in inputs.nominated if p.key not in keys]
    return Rules.of(quotas, lowest, others, request=request, what="gang")


@dataclass(frozen=True)
class QuotaGate:
    """Reclaim for a gang its quota refused (all quotas together over the sum of their
    mins, while its own stays within its min with the gang): a trial counts only where the
    quota admits the gang with the trial's pods gone, wherever they run. The quota rule is
    cluster-wide, so its victims need not be on the plan's nodes."""

    rules: Rules

    def refusal(self, removed: Sequence[Pod]) -> str | None:
        """None when the quota admits the gang with ``removed`` gone, else why not."""
        ledger = self.rules.ledger()
        ledger.take(removed)
        if self.rules.admits(ledger):
            return None
        return "the quota still refuses the gang with these pods gone"

    def excess(self, unit: Unit) -> Fraction:
        """How far the unit's quota is above its fair share (0 without fair share): the
        reprieve puts back the units of quotas nearest their share first."""
        return self.rules.excess(unit[0].namespace)


def quota_gate(members: Sequence[Pod], inputs: Inputs) -> QuotaGate | None:
    """The gate for a gang whose quorum (``members``) its quota refused, when reclaim may
    serve it: quotas in force, and its quota within its min with the gang (above it, only
    its own lower-priority pods could go, and those the quota already counts)."""
    rules = gang_rules(members, inputs)
    if rules is None or rules.own is None or rules.above_min:
        return None
    return QuotaGate(rules)


def candidate_units(
    framework: Framework,
    snapshot: Snapshot,
    members: Sequence[Pod],
    inputs: Inputs,
    *,
    own_gang: str | None = None,
    representatives: Sequence[Pod] | None = None,
    seed: int = 0,
) -> list[Unit]:
    """Units a preemption for the gang may evict, most important first (see the module
    docstring, step 3). ``own_gang``: the preempting gang's key (its placed members stay);
    ``representatives``: one member per class (the problem's), else every member."""
    priority = gang_priority(members)
    rules = gang_rules(members, inputs)
    if (rules is None or rules.above_min) and not snapshot.has_priority_below(priority):
        return []
    own = {m.key for m in members}
    rows: set[int] = set()
    for rep in representatives if representatives is not None else members:
        decision = framework.schedule(
            snapshot,
            rep,
            seed=seed,
            topology=inputs.topology,
            load=inputs.load,
            volumes=inputs.volumes,
            dra=inputs.dra,
        )
        codes = decision.explanation.node_codes
        names = decision.explanation.node_names
        for name, code in zip(names, codes.tolist(), strict=True):
            if code in (0, Code.UNSCHEDULABLE):
                row = snapshot.index_of(name)
                if row is not None:
                    rows.add(row)
    units: dict[str, Unit] = {}
    for row in sorted(rows):
        for pod in snapshot.pods_on(row):
            if pod.key in own:
                continue
            if rules is None and not inputs.evictable(pod, priority):
                continue
            if rules is not None and not rules.could_take_unit(inputs.unit_of(pod)):
                continue
            key = inputs.unit_key(pod)
            if key == own_gang:
                continue
            if key not in units:
                units[key] = tuple(
                    sorted(inputs.unit_of(pod), key=lambda p: unit_importance((p,), inputs))
                )
    return sorted(units.values(), key=lambda u: unit_importance(u, inputs))


@contextmanager
def without(
    snapshot: Snapshot,
    pods: Sequence[Pod],
    topology: TopologyState | None = None,
    volumes: VolumeState | None = None,
    dra: DraState | None = None,
) -> Iterator[None]:
    """``pods`` taken out of the snapshot, the device ledger and the claims' users (so a
    victim's ReadWriteOncePod claim is free), and their DRA devices freed, for the ``with``
    block, then put back on their nodes in their original order (pod order is
    observable)."""
    originals: dict[str, list[Pod]] = {}
    present: list[tuple[Pod, str, bool]] = []
    for pod in pods:
        node = snapshot.node_of_pod(pod.key)
        row = snapshot.index_of(node) if node else None
        if node is None or row is None:
            continue
        if node not in originals:
            originals[node] = list(snapshot.pods_on(row))
        held = topology is not None and topology.ledger.holding(pod.key) is not None
        present.append((pod, node, held))
    for pod, _, held in present:
        snapshot.remove_pod(pod.key)
        if held and topology is not None:
            topology.pod_removed(pod.key)
        if volumes is not None:
            volumes.remove_pod(pod.key)
    freed: list[DeviceId] = []
    if dra is not None:
        for pod, _, _ in present:
            if pod.resource_claims or pod.container_requests:  # its claims, or the one
                freed += dra.held_by(pod.uid)  # made for its extended resources
        dra.release(freed)
    try:
        yield
    finally:
        if dra is not None:
            dra.hold(freed)
        if volumes is not None:
            for pod, _, _ in present:
                if pod.storage_volumes:
                    volumes.add_pod(pod)
        for node, original in originals.items():
            row = snapshot.index_of(node)
            assert row is not None
            for pod in list(snapshot.pods_on(row)):
                snapshot.remove_pod(pod)
            for pod in original:
                snapshot.add_pod(pod, node)
        if topology is not None:
            for pod, node, held in present:
                if held:
                    topology.pod_placed(pod, node, pod.annotations)


def problem_without(
    framework: Framework,
    snapshot: Snapshot,
    gang: GangSpec,
    members: Sequence[Pod],
    removed: Sequence[Pod],
    *,
    need: int,
    topology: TopologyState | None = None,
    load: LoadView | None = None,
    seed: int = 0,
    volumes: VolumeState | None = None,
    nominated: Sequence[tuple[Pod, str]] = (),
    dra: DraState | None = None,
    levels: Sequence[str] = (),
    home: str | None = None,
    slice_bound: Sequence[tuple[str, int]] = (),
    bound_nodes: Sequence[str] = (),
) -> GangProblem:
    """The gang's problem on the snapshot with ``removed`` gone (restored on return);
    ``nominated`` counted as :func:`~scheduler.solver.problem.build_problem` counts them."""
    gone = {p.key for p in removed}
    with without(snapshot, removed, topology, volumes, dra):
        return build_problem(
            framework,
            snapshot,
            gang,
            members,
            need=need,
            topology=topology,
            load=load,
            seed=seed,
            volumes=volumes,
            nominated=[(p, n) for p, n in nominated if p.key not in gone],
            dra=dra,
            levels=levels,
            home=home,
            slice_bound=slice_bound,
            bound_nodes=bound_nodes,
        )


@dataclass(frozen=True)
class GangPreemption:
    """Pods to evict so that the gang fits, and the plan that fits once they are gone."""

    victims: tuple[Pod, ...]
    """Most important first; a gang's members together."""
    units: int
    """Victim units (a gang counts once)."""
    plan: GangPlan
    pdb_violations: int
    trials: int
    """Solves the search ran."""
    checks: int = 0
    """Trials the plan in hand decided without a solve."""

    @property
    def nodes(self) -> tuple[str, ...]:
        """The plan's nodes, in member order, without repeats."""
        return tuple(dict.fromkeys(node for _, node in self.plan.placements))


class _Stage(enum.Enum):
    ALL = "all"
    SETTLE = "settle"
    REPRIEVE = "reprieve"
    DONE = "done"


def plan_fits(plan: GangPlan, problem: GangProblem) -> bool:
    """Whether ``plan`` (its members on its nodes) is a placement of at least ``need``
    members in ``problem``: every node still there and every rule of the model kept
    (:func:`~scheduler.solver.check.violations`). A trial this plan survives needs no
    solve, so it cannot time out."""
    if problem.rejection is not None or not plan.admitted:
        return False
    index = {name: n for n, name in enumerate(problem.node_names)}
    counts = np.zeros((problem.num_classes, problem.num_nodes), dtype=np.int64)
    for member, node in plan.placements:
        n = index.get(node)
        if n is None or member >= len(problem.member_class):
            return False
        counts[problem.member_class[member], n] += 1
    return int(counts.sum()) >= problem.need and not violations(problem, counts)


class VictimSearch:
    """The search of the module docstring, one trial at a time: :meth:`trial` names the
    pods to remove (None once done); the caller builds the problem without them and asks
    :meth:`needs_solve`; only if it says so, the caller solves and :meth:`tell`\\ s the plan.
    """

    def __init__(
        self,
        units: Sequence[Unit],
        inputs: Inputs,
        node_of: Callable[[Pod], str | None],
        *,
        max_trials: int = MAX_REPRIEVE_TRIALS,
        gate: QuotaGate | None = None,
    ) -> None:
        self._units = list(units)
        self._inputs = inputs
        self._node_of = node_of
        self._max_trials = max_trials
        self._gate = gate
        """Reclaim for a gang its quota refused: victims anywhere, fair share's order."""
        self._stage = _Stage.ALL if self._units else _Stage.DONE
        self._current: set[int] = set(range(len(self._units)))
        """Indices of the units removed now."""
        self._plan: GangPlan | None = None
        self._confirmed = False
        """:attr:`_plan` fits with exactly :attr:`_current` removed (a timeout that spared
        a unit leaves it unconfirmed)."""
        self._pending: set[int] = set(self._current)
        """The removal the last :meth:`trial` named."""
        self._check: GangPlan | None = None
        """The plan :meth:`needs_solve` checks the trial's problem against first."""
        self._starting = True
        """Settling the first plan (else a pass's result)."""
        self._settle_solves = 0
        self._start: tuple[set[int], GangPlan | None] = (set(), None)
        self._orders: list[list[int]] = []
        self._order: list[int] = []
        self._results: list[tuple[set[int], GangPlan]] = []
        self._pass = 0
        self._next = 0
        self._pass_solves = 0
        self.trials = 0
        """Solves told."""
        self.checks = 0
        """Trials the plan in hand decided without a solve."""
        self.reprieve_trials = 0
        self.timeouts = 0
        """Reprieve solves that ran out of time (each spared its unit)."""
        self.message = NO_VICTIMS_MESSAGE if not self._units else ""

    # ------------------------------------------------------------------ protocol
    def trial(self) -> list[Pod] | None:
        """The pods to remove for the next problem, or None when the search is over."""
        if self._stage is _Stage.DONE:
            return None
        return [p for i in sorted(self._pending) for p in self._units[i]]

    def needs_solve(self, problem: GangProblem) -> bool:
        """Whether :meth:`trial`'s problem must be solved (then :meth:`tell` the plan).
        False when the plan in hand fits it (the removal is taken), or when a reprieve pass
        is out of solves (the unit stays a victim)."""
        if self._check is not None and plan_fits(self._check, problem):
            self.checks += 1
            self._current, self._plan, self._confirmed = set(self._pending), self._check, True
            if self._stage is _Stage.SETTLE:
                self._settle()
            else:
                self._advance()
            return False
        if self._stage is _Stage.REPRIEVE:
            if self._pass_solves >= self._max_trials:
                self.checks += 1
                self._advance()  # out of solves: the unit stays a victim
                return False
            self._pass_solves += 1
            self.reprieve_trials += 1
        elif self._stage is _Stage.SETTLE:
            self._settle_solves += 1
        return True

    def tell(self, plan: GangPlan) -> None:
        """The plan solved for the problem :meth:`needs_solve` asked to solve."""
        self.trials += 1
        timed_out = plan.status is SolveStatus.TIMEOUT_REJECTED
        stage = self._stage
        if plan.admitted:
            self._current, self._plan, self._confirmed = set(self._pending), plan, True
            if stage is _Stage.REPRIEVE:
                self._advance()
            elif stage is _Stage.ALL and len(self._current) <= self._max_trials:
                self._starting = False  # few enough to try each: the passes settle at the end
                self._start_reprieve()
            else:
                self._settle()
        elif stage is _Stage.ALL:
            self._give_up(TIMED_OUT_MESSAGE if timed_out else NOT_HELPFUL_MESSAGE)
        elif stage is _Stage.SETTLE:
            if timed_out:
                message = TIMED_OUT_MESSAGE
            elif self._pending != self._current:
                message = OFF_PLAN_MESSAGE
            else:
                message = UNCONFIRMED_MESSAGE
            self._unsettled(message)
        elif timed_out:
            # Never evict on a timeout: the unit is spared; the pass's end confirms a plan.
            self.timeouts += 1
            self._current, self._confirmed = set(self._pending), False
            self._advance()
        else:
            self._advance()  # proven (or greedy alone fell short): the unit stays a victim

    # ------------------------------------------------------------------ stages
    def _touches(self, i: int, nodes: set[str]) -> bool:
        return any(self._node_of(p) in nodes for p in self._units[i])

    def _settle(self) -> None:
        """Make the victims those of a plan that fits with exactly them removed, all with a
        pod on its nodes (kube evicts only on the node it nominates): drop the others if the
        plan holds without them (a check, else a solve; a new plan settles again)."""
        if self._plan is None:
            self._unsettled(UNCONFIRMED_MESSAGE)
            return
        if self._confirmed:
            nodes = {node for _, node in self._plan.placements}
            narrow = {i for i in self._current if self._touches(i, nodes)}
            if narrow == self._current or self._gate is not None:
                self._settled()
                return
            if not narrow:
                self._unsettled(OFF_PLAN_MESSAGE)
                return
        else:
            narrow = set(self._current)  # first a plan for exactly these, then its nodes
        if self._settle_solves >= self._max_trials:
            self._unsettled(UNCONFIRMED_MESSAGE)
            return
        self._pending, self._check = narrow, self._plan
        self._stage = _Stage.SETTLE

    def _settled(self) -> None:
        if self._starting:
            self._starting = False
            self._start_reprieve()
            return
        assert self._plan is not None
        self._results.append((set(self._current), self._plan))
        self._end_pass()

    def _unsettled(self, message: str) -> None:
        self.message = message
        if self._starting:
            self._give_up(message)
            return
        self._end_pass()

    def _give_up(self, message: str) -> None:
        self._plan = None
        self.message = message
        self._stage = _Stage.DONE

    def _start_reprieve(self) -> None:
        """One reprieve pass per order (two when gangs are among the units), each from the
        same starting set; the best result wins (:meth:`_cost`)."""
        self._start = (set(self._current), self._plan)
        orders = [self._reprieve_order(larger_first=True)]
        smaller = self._reprieve_order(larger_first=False)
        if smaller != orders[0]:
            orders.append(smaller)
        self._orders = orders
        self._results = []
        self._begin_pass(0)

    def _reprieve_order(self, *, larger_first: bool) -> list[int]:
        """PDB-violating units first, then the others; each group most important first:
        higher priority, then (among equals) the larger or the smaller unit, then earlier
        start. Keeping a gang first spares more pods when the singles can make room;
        keeping the singles first does when the gang can: neither order wins always."""

        gate = self._gate

        def key(i: int) -> tuple[Fraction, int, int, float]:
            unit = self._units[i]
            priority, start = unit_importance(unit, self._inputs)
            excess = gate.excess(unit) if gate is not None else Fraction(0)
            return (excess, priority, -len(unit) if larger_first else len(unit), start)

        ordered = sorted(self._current, key=key)
        violating, fine = split_units_by_pdb([self._units[i] for i in ordered], self._inputs.pdbs)
        index = {id(self._units[i]): i for i in ordered}
        return [index[id(u)] for u, _ in violating] + [index[id(u)] for u in fine]

    def _begin_pass(self, k: int) -> None:
        current, self._plan = self._start
        self._current, self._confirmed = set(current), True
        self._pass = k
        self._order = self._orders[k]
        self._next = 0
        self._pass_solves = 0
        self._settle_solves = 0
        self._stage = _Stage.REPRIEVE
        self._advance()

    def _advance(self) -> None:
        """Name the next unit to put back, or settle the pass's result."""
        while self._next < len(self._order):
            i = self._order[self._next]
            self._next += 1
            if len(self._current) == 1:
                break  # the last unit: without it the gang did not fit before
            self._pending = self._current - {i}
            self._check = self._plan
            self._stage = _Stage.REPRIEVE
            return
        self._settle()

    def _end_pass(self) -> None:
        if self._pass + 1 < len(self._orders):
            self._begin_pass(self._pass + 1)
            return
        if not self._results:
            self._give_up(self.message or UNCONFIRMED_MESSAGE)
            return
        # The best by kube's criteria (the first pass wins ties).
        self._current, self._plan = min(self._results, key=lambda r: self._cost(r[0]))
        self._stage = _Stage.DONE

    def _ordered(self, chosen: set[int]) -> list[Unit]:
        ordered = sorted(chosen, key=lambda i: unit_importance(self._units[i], self._inputs))
        return [self._units[i] for i in ordered]

    def _cost(self, chosen: set[int]) -> tuple[int, int, int, int]:
        """kube's candidate criteria, smaller is better: PDB violations, the highest victim
        priority, the sum of ``priority + 2**31`` over victims, the number of victims."""
        units = self._ordered(chosen)
        violating, _ = split_units_by_pdb(units, self._inputs.pdbs)
        pods = [p for u in units for p in u]
        return (
            sum(n for _, n in violating),
            max((p.priority for p in pods), default=0),
            sum(p.priority + PRIORITY_OFFSET for p in pods),
            len(pods),
        )

    @property
    def done(self) -> bool:
        return self._stage is _Stage.DONE

    def result(self) -> GangPreemption | None:
        """The victims and their plan once done (None: no eviction is backed by a plan)."""
        if self._stage is not _Stage.DONE or self._plan is None:
            return None
        units = self._ordered(self._current)
        return GangPreemption(
            victims=tuple(p for u in units for p in u),
            units=len(units),
            plan=self._plan,
            pdb_violations=self._cost(self._current)[0],
            trials=self.trials,
            checks=self.checks,
        )


def preempt_gang(
    framework: Framework,
    snapshot: Snapshot,
    gang: GangSpec,
    members: Sequence[Pod],
    inputs: Inputs,
    *,
    need: int,
    solve_fn: Callable[[GangProblem], GangPlan],
    seed: int = 0,
    max_trials: int = MAX_REPRIEVE_TRIALS,
    gate: QuotaGate | None = None,
) -> GangPreemption | None:
    """The whole search on one snapshot, synchronously: the victims and the plan, or None
    when the gang may not preempt or no eviction of lower-priority pods lets it fit.
    ``gate``: reclaim for a gang its quota refused (:func:`quota_gate`)."""
    if ineligible_reason(snapshot, members, inputs) is not None:
        return None
    units = candidate_units(framework, snapshot, members, inputs, own_gang=gang.key, seed=seed)
    search = VictimSearch(units, inputs, node_lookup(snapshot), max_trials=max_trials, gate=gate)
    base: GangProblem | None = None
    while (removed := search.trial()) is not None:
        why = gate.refusal(removed) if gate is not None else None
        if why is not None:
            if base is None:
                base = build_problem(framework, snapshot, gang, members, need=need, dra=inputs.dra)
            problem = dataclasses.replace(base, rejection=why)
        else:
            problem = problem_without(
                framework,
                snapshot,
                gang,
                members,
                removed,
                need=need,
                topology=inputs.topology,
                load=inputs.load,
                seed=seed,
                volumes=inputs.volumes,
                dra=inputs.dra,
            )
        if search.needs_solve(problem):
            search.tell(solve_fn(problem))
    return search.result()


def node_lookup(snapshot: Snapshot) -> Callable[[Pod], str | None]:
    """Where a pod is placed in ``snapshot`` now (for :class:`VictimSearch`)."""

    def node_of(pod: Pod) -> str | None:
        return snapshot.node_of_pod(pod.key)

    return node_of

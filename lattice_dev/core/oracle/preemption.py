"""Reference DefaultPreemption: kube-scheduler 1.34's algorithm as plain per-node loops.

No screening, no incremental snapshot: every "does the pod fit on this node now?" builds a
fresh snapshot from the node, pod and namespace lists with the removed pods left out (and
the nominated pods added), and runs the whole framework restricted to that node. Slow on
purpose; the property tests check :func:`scheduler.core.preemption.preempt` against it.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence

from scheduler.core.explain import Decision
from scheduler.core.framework import Code
from scheduler.core.preemption import (
    PRIORITY_OFFSET,
    Candidate,
    Inputs,
    Preemption,
    num_candidates,
)
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.model.node import Namespace, Node
from scheduler.model.pod import Pod
from scheduler.model.pod_facts import PreemptionPolicy


class _World:
    """The cluster as lists, so each check starts from nothing."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.nodes: list[Node] = list(snapshot.nodes())
        self.pods: list[tuple[Pod, str]] = [
            (pod, snapshot.node_names[row])
            for row in range(snapshot.num_nodes)
            for pod in snapshot.pods_on(row)
        ]
        self.namespaces = [Namespace(k, v) for k, v in snapshot.namespaces().items()]

    def fits(
        self, framework: Framework, pod: Pod, node: str, removed: set[str], nominated: list[Pod]
    ) -> bool:
        def run(extra: list[Pod]) -> bool:
            pods = [(p, n) for p, n in self.pods if p.key not in removed]
            pods += [(p, node) for p in extra]
            snap = Snapshot(self.nodes, pods, self.namespaces)
            decision = framework.schedule(snap, pod, restrict_to=frozenset({node}))
            return decision.selected == node

        if not nominated:
            return run([])
        return run(nominated) and run([])


def _more_important(inputs: Inputs, a: Pod, b: Pod) -> int:
    """``MoreImportantPod`` as a comparison: -1 when ``a`` goes first."""
    if a.priority != b.priority:
        return -1 if a.priority > b.priority else 1
    sa, sb = inputs.facts_of(a).start_key, inputs.facts_of(b).start_key
    return -1 if sa < sb else (1 if sa > sb else 0)


def _eligible(snapshot: Snapshot, pod: Pod, decision: Decision, inputs: Inputs) -> bool:
    if inputs.facts_of(pod).preemption_policy == PreemptionPolicy.NEVER:
        return False
    if not pod.nominated_node_name:
        return True
    names = decision.explanation.node_names
    for i, name in enumerate(names):
        code = decision.explanation.node_codes[i]
        if name == pod.nominated_node_name and code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
            return True
    for row in range(snapshot.num_nodes):
        if snapshot.node_names[row] != pod.nominated_node_name:
            continue
        for other in snapshot.pods_on(row):
            if other.priority < pod.priority and inputs.facts_of(other).terminating_by_preemption:
                return False
    return True


def _select_victims(
    world: _World, framework: Framework, pod: Pod, node: str, inputs: Inputs
) -> Candidate | None:
    nominated = [
        p
        for p, n in inputs.nominated
        if n == node and p.priority >= pod.priority and p.key != pod.key
    ]
    potential = [p for p, n in world.pods if n == node and p.priority < pod.priority]
    if not potential:
        return None
    removed = {p.key for p in potential}
    if not world.fits(framework, pod, node, removed, nominated):
        return None
    potential.sort(key=functools.cmp_to_key(lambda a, b: _more_important(inputs, a, b)))
    allowed = [pdb.disruptions_allowed for pdb in inputs.pdbs]
    violating: list[Pod] = []
    fine: list[Pod] = []
    for p in potential:
        hit = False
        for i, pdb in enumerate(inputs.pdbs):
            if pdb.namespace != p.namespace or not p.labels:
                continue
            if pdb.selector.is_empty or not pdb.selector.matches(p.labels):
                continue
            if p.name in pdb.disrupted_pods:
                continue
            allowed[i] -= 1
            if allowed[i] < 0:
                hit = True
        if hit:
            violating.append(p)
        else:
            fine.append(p)
    victims: list[Pod] = []
    violations = 0
    for p in violating:
        removed.discard(p.key)
        if not world.fits(framework, pod, node, removed, nominated):
            removed.add(p.key)
            victims.append(p)
            violations += 1
    for p in fine:
        removed.discard(p.key)
        if not world.fits(framework, pod, node, removed, nominated):
            removed.add(p.key)
            victims.append(p)
    if violating and fine:
        victims.sort(key=functools.cmp_to_key(lambda a, b: _more_important(inputs, a, b)))
    if not victims:
        return None
    return Candidate(node, tuple(victims), violations)


def _pick(candidates: list[Candidate], inputs: Inputs) -> list[Candidate]:
    def violations(c: Candidate) -> float:
        return -c.pdb_violations

    def highest(c: Candidate) -> float:
        return -c.victims[0].priority

    def total(c: Candidate) -> float:
        s = 0
        for v in c.victims:
            s += v.priority + PRIORITY_OFFSET
        return -s

    def count(c: Candidate) -> float:
        return -len(c.victims)

    def latest_start(c: Candidate) -> float:
        earliest = inputs.facts_of(c.victims[0]).start_key
        top = c.victims[0].priority
        for v in c.victims:
            start = inputs.facts_of(v).start_key
            if v.priority == top and start < earliest:
                earliest = start
            elif v.priority > top:
                top, earliest = v.priority, start
        return earliest

    remaining = candidates
    for f in (violations, highest, total, count, latest_start):
        selected: list[Candidate] = []
        best = -float("inf")
        for c in remaining:
            score = f(c)
            if score > best:
                best, selected = score, []
            if score == best:
                selected.append(c)
        if len(selected) == 1:
            return selected
        remaining = selected
    return remaining


def preempt(
    framework: Framework,
    snapshot: Snapshot,
    decision: Decision,
    inputs: Inputs | None = None,
) -> Preemption | None:
    """Same contract as :func:`scheduler.core.preemption.preempt`."""
    inputs = inputs or Inputs()
    pod = decision.pod
    if not _eligible(snapshot, pod, decision, inputs):
        return None
    explanation = decision.explanation
    codes = dict(zip(explanation.node_names, explanation.node_codes.tolist(), strict=True))
    potential = [n for n in snapshot.node_names if codes.get(n) == Code.UNSCHEDULABLE]
    if not potential:
        return None
    world = _World(snapshot)
    wanted = num_candidates(len(potential))
    offset = random.Random(inputs.seed).randrange(len(potential))
    clean: list[Candidate] = []
    violating: list[Candidate] = []
    for i in range(len(potential)):
        node = potential[(offset + i) % len(potential)]
        found = _select_victims(world, framework, pod, node, inputs)
        if found is None:
            continue
        bucket = violating if found.pdb_violations else clean
        if len(bucket) < wanted:
            bucket.append(found)
        if clean and len(clean) + len(violating) >= wanted:
            break
    candidates: Sequence[Candidate] = clean + violating
    if not candidates:
        return None
    tied = _pick(list(candidates), inputs)
    best = tied[0]
    return Preemption(
        best.node,
        best.victims,
        best.pdb_violations,
        tuple(candidates),
        tuple(c.node for c in tied),
    )

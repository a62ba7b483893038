"""A brute-force reference for gang plans, from the raw nodes and pods alone.

Nothing here reads a :class:`~scheduler.solver.problem.GangProblem`: no member classes, no
limits, no joint-rule arrays. Each member's feasible nodes come from the framework run on
that member by itself (the kube-verified core); every rule between members is restated on
the pods' own fields, and the most members any assignment places is found by enumerating
assignments (member by member, pruned). A mistake in build_problem's classes, limits or
rules makes the solver disagree with this.

Scope: what the property tests generate. Members in one namespace without node affinity
or host ports, no Topology devices; the rules are capacity and pod slots, required
anti-affinity between members, hard spread on final counts (the model's reading), the
members starting an affinity group kept in one labelled domain (the model's conservative
reading), and the gang's one-domain key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.model.names import PODS
from scheduler.model.node import Node
from scheduler.model.pod import Pod, PodAffinityTerm, UnsatisfiableAction

Assignment = Sequence[str | None]
"""Per member, its node (None: not placed)."""


def _matches(term: PodAffinityTerm, pod: Pod) -> bool:
    return pod.namespace in term.namespaces and term.selector.matches(pod.labels)


@dataclass(frozen=True)
class Reference:
    nodes: Mapping[str, Node]
    placed: Sequence[tuple[Pod, str]]
    members: Sequence[Pod]
    topology_key: str | None
    feasible: Sequence[frozenset[str]]
    """Per member, the nodes the framework accepts for it alone."""

    @classmethod
    def of(
        cls,
        framework: Framework,
        snapshot: Snapshot,
        nodes: Sequence[Node],
        placed: Sequence[tuple[Pod, str]],
        members: Sequence[Pod],
        topology_key: str | None,
    ) -> Reference:
        for pod in members:
            if pod.node_selector or pod.required_node_affinity or pod.host_ports:
                raise NotImplementedError("outside the reference's scope")
        feasible = []
        for pod in members:
            rows = framework.schedule(snapshot, pod).explanation.feasible_rows.tolist()
            feasible.append(frozenset(snapshot.node_names[r] for r in rows))
        return cls({n.name: n for n in nodes}, placed, members, topology_key, feasible)

    # ------------------------------------------------------------------ rules
    def violations(self, assignment: Assignment, *, final: bool = True) -> list[str]:
        """Rules ``assignment`` breaks; ``final=False`` skips spread (it can only be judged
        once every member is decided)."""
        out: list[str] = []
        on = [(i, n) for i, n in enumerate(assignment) if n is not None]
        for i, n in on:
            if n not in self.feasible[i]:
                out.append(f"member {i}: {n} is not feasible for it")
        out += self._capacity(on)
        out += self._anti(on)
        out += self._groups(on)
        if self.topology_key is not None:
            values = {self.nodes[n].labels.get(self.topology_key) for _, n in on}
            if len(values) > 1 or None in values:
                out.append(f"members span {values} of {self.topology_key}")
        if final:
            out += self._spread(on)
        return out

    def _capacity(self, on: list[tuple[int, str]]) -> list[str]:
        out = []
        used: dict[tuple[str, str], int] = {}
        for pod, node in [*self.placed, *((self.members[i], n) for i, n in on)]:
            used[(node, PODS)] = used.get((node, PODS), 0) + 1
            for resource, amount in pod.resources.requests.items():
                if resource != PODS:
                    used[(node, resource)] = used.get((node, resource), 0) + amount
        gang_nodes = {n for _, n in on}
        for (node, resource), amount in used.items():
            if node in gang_nodes and amount > self.nodes[node].allocatable.get(resource, 0):
                out.append(f"{node}: {amount} {resource}, {self.nodes[node].allocatable}")
        return out

    def _anti(self, on: list[tuple[int, str]]) -> list[str]:
        out = []
        for i, n in on:
            for term in self.members[i].required_anti_affinity:
                mine = self.nodes[n].labels.get(term.topology_key)
                if mine is None:
                    continue
                for j, m in on:
                    theirs = self.nodes[m].labels.get(term.topology_key)
                    if j != i and theirs == mine and _matches(term, self.members[j]):
                        out.append(f"anti-affinity of member {i} meets member {j}")
        return out

    def _groups(self, on: list[tuple[int, str]]) -> list[str]:
        out = []
        for i, pod in enumerate(self.members):
            terms = pod.required_affinity
            if not terms or not all(_matches(t, pod) for t in terms):
                continue
            keys = {t.topology_key for t in terms}
            if any(
                all(_matches(t, other) for t in terms) and keys <= self.nodes[node].labels.keys()
                for other, node in self.placed
            ):
                continue  # anchored by a placed pod (kube counts it): the framework decides
            group = [(j, m) for j, m in on if all(_matches(t, self.members[j]) for t in terms)]
            for key in keys:
                values = {self.nodes[m].labels.get(key) for _, m in group}
                if len(values) > 1 or None in values:
                    out.append(f"affinity group of member {i} spans {values} of {key}")
        return out

    def _spread(self, on: list[tuple[int, str]]) -> list[str]:
        out = []
        for i, n in on:
            pod = self.members[i]
            hard = [
                c
                for c in pod.spread_constraints
                if c.when_unsatisfiable is UnsatisfiableAction.DO_NOT_SCHEDULE
            ]
            # Nodes with every hard key (no node affinity to honour; taints ignored).
            eligible = [
                node
                for node in self.nodes.values()
                if all(c.topology_key in node.labels for c in hard)
            ]
            for c in hard:
                if c.selector.is_empty:
                    continue
                counts = {node.labels[c.topology_key]: 0 for node in eligible}
                everyone = [*self.placed, *((self.members[j], m) for j, m in on)]
                for other, node_name in everyone:
                    value = self.nodes[node_name].labels.get(c.topology_key)
                    if value is None or value not in counts or other.namespace != pod.namespace:
                        continue
                    if c.selector.matches(other.labels):
                        counts[value] += 1
                low = min(counts.values()) if len(counts) >= c.min_domains else 0
                mine = counts.get(self.nodes[n].labels.get(c.topology_key, ""), 0)
                if mine - low > c.max_skew:
                    out.append(f"spread of member {i} over {c.topology_key}: {mine}, min {low}")
        return out

    # ----------------------------------------------------------------- search
    def most_placed(self) -> int:
        """The most members one valid assignment places (exhaustive, pruned)."""
        members = len(self.members)
        best = 0
        assignment: list[str | None] = []

        def visit(i: int, placed: int) -> bool:
            nonlocal best
            if placed + (members - i) <= best:
                return False
            if i == members:
                if not self.violations(assignment):
                    best = placed
                return best == members
            for node in sorted(self.feasible[i]):
                assignment.append(node)
                ok = not self.violations(assignment, final=False)
                if ok and visit(i + 1, placed + 1):
                    return True
                assignment.pop()
            assignment.append(None)
            done = visit(i + 1, placed)
            assignment.pop()
            return done

        visit(0, 0)
        return best

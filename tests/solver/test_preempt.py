"""Gang preemption, pure: which pods a gang evicts so that all of it fits, or none."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

from scheduler.core.preemption import NEVER_MESSAGE, TERMINATING_MESSAGE, Inputs
from scheduler.core.snapshot import Snapshot
from scheduler.model.pdb import PodDisruptionBudget
from scheduler.model.pod import Pod
from scheduler.model.pod_facts import PodFacts, PreemptionPolicy
from scheduler.solver import GangPlan, GangProblem, solve
from scheduler.solver.preempt import (
    GangPreemption,
    VictimSearch,
    candidate_units,
    ineligible_reason,
    node_lookup,
    preempt_gang,
)
from scheduler.solver.solve import SolveStatus
from tests.builders import cluster, make_node, make_pod
from tests.core.test_preemption_volumes import claimant, storage
from tests.solver.support import framework, gang, problem_for

SOLVE = functools.partial(solve, time_limit_s=1.0)


def pod(name: str, cpu: str, priority: int, **labels: str) -> Pod:
    return make_pod(name, cpu=cpu).priority(priority).uid(name).labels(labels).build()


def members(n: int, cpu: str = "2", priority: int = 100) -> list[Pod]:
    return [pod(f"hi-{i}", cpu, priority) for i in range(n)]


def with_gangs(
    placed: Sequence[tuple[Pod, str]], gangs: Mapping[str, Sequence[str]], **kw: object
) -> Inputs:
    by_name = {p.name: p for p, _ in placed}
    return Inputs(
        gangs={by_name[m].key: g for g, names in gangs.items() for m in names},
        gang_members={g: tuple(by_name[m] for m in names) for g, names in gangs.items()},
        **kw,  # type: ignore[arg-type]
    )


def run(
    snapshot: Snapshot, gang_members: Sequence[Pod], inputs: Inputs, *, need: int | None = None
) -> GangPreemption | None:
    need = len(gang_members) if need is None else need
    before = [[p.key for p in snapshot.pods_on(i)] for i in range(snapshot.num_nodes)]
    requested = snapshot.requested.copy()
    found = preempt_gang(
        framework(),
        snapshot,
        gang(min_member=need),
        gang_members,
        inputs,
        need=need,
        solve_fn=SOLVE,
    )
    # The snapshot is as it was, pods in their order.
    assert [[p.key for p in snapshot.pods_on(i)] for i in range(snapshot.num_nodes)] == before
    assert (snapshot.requested == requested).all()
    if found is not None:
        assert found.plan.admitted
        assert found.plan.placed >= need
    return found


def victims(found: GangPreemption | None) -> list[str] | None:
    return None if found is None else sorted(v.name for v in found.victims)


def full_cluster() -> tuple[list[tuple[Pod, str]], Snapshot]:
    """4 nodes of 4 cpu: a low gang (4 members of 2 cpu, one per node, priority 1) and one
    2-cpu single pod per node (priority 1 on n0/n1, 5 on n2/n3)."""
    placed: list[tuple[Pod, str]] = []
    for i in range(4):
        placed.append((pod(f"lo-{i}", "2", 1), f"n{i}"))
        placed.append((pod(f"s-{i}", "2", 1 if i < 2 else 5), f"n{i}"))
    nodes = [make_node(f"n{i}", cpu="4") for i in range(4)]
    return placed, cluster(nodes, placed)


def test_the_whole_lower_gang_or_none_of_it() -> None:
    placed, snapshot = full_cluster()
    inputs = with_gangs(placed, {"default/lo": [f"lo-{i}" for i in range(4)]})
    # A gang of 4 x 2 cpu needs 8 cpu: the lower gang's 4 members free exactly that, or
    # the four singles do. Units are reprieved most important first: the priority-5 singles,
    # then the gang (priority 1, a unit), then the priority-1 singles: the gang goes whole.
    found = run(snapshot, members(4), inputs)
    assert victims(found) == [f"lo-{i}" for i in range(4)]
    assert found is not None
    assert found.units == 1
    # Never a part of it: every lo member or none.
    lo = {v.name for v in found.victims if v.name.startswith("lo-")}
    assert len(lo) in (0, 4)


def test_smaller_gang_needs_fewer_victims_but_the_gang_unit_stays_whole() -> None:
    placed, snapshot = full_cluster()
    inputs = with_gangs(placed, {"default/lo": [f"lo-{i}" for i in range(4)]})
    # 2 members of 2 cpu: two priority-1 singles suffice (cheaper than the gang of 4).
    found = run(snapshot, members(2), inputs)
    assert victims(found) == ["s-0", "s-1"]


def test_without_the_gang_mapping_members_are_ordinary_pods() -> None:
    _placed, snapshot = full_cluster()
    found = run(snapshot, members(4), Inputs())
    assert found is not None
    assert len(found.victims) == 4
    assert not any(v.name.startswith("s-2") or v.name.startswith("s-3") for v in found.victims)


def test_nothing_is_evicted_when_the_gang_cannot_fit_even_with_every_lower_pod_gone() -> None:
    placed, snapshot = full_cluster()
    inputs = with_gangs(placed, {"default/lo": [f"lo-{i}" for i in range(4)]})
    assert run(snapshot, members(5, cpu="4"), inputs) is None  # 5 x 4 cpu on 4 nodes
    # Higher-priority pods are never victims: with priority 3 only the priority-1 pods may
    # go (lo and s-0, s-1): 4 nodes x 2 cpu freed is 8 cpu, not enough for 3 x 4 cpu.
    assert run(snapshot, members(3, cpu="4", priority=3), inputs) is None


def test_a_gang_with_a_member_of_higher_priority_is_never_a_victim() -> None:
    placed, snapshot = full_cluster()
    lo = [p for p, _ in placed if p.name.startswith("lo-")]
    lo[3] = pod("lo-3", "2", 1000)
    placed = [(lo[int(p.name[-1])] if p.name.startswith("lo-") else p, n) for p, n in placed]
    snapshot = cluster([make_node(f"n{i}", cpu="4") for i in range(4)], placed)
    inputs = with_gangs(placed, {"default/lo": [f"lo-{i}" for i in range(4)]})
    # The gang is protected by its priority-1000 member; the singles free 8 cpu.
    found = run(snapshot, members(4), inputs)
    assert victims(found) == [f"s-{i}" for i in range(4)]


def test_preemption_policy_never_and_terminating_victims() -> None:
    _placed, snapshot = full_cluster()
    gm = members(4)
    never = Inputs(facts={gm[0].key: PodFacts(preemption_policy=PreemptionPolicy.NEVER)})
    assert ineligible_reason(snapshot, gm, never) == NEVER_MESSAGE
    assert run(snapshot, gm, never) is None
    waiting = Inputs(
        nominated=[(gm[1], "n0")], facts={"s-0": PodFacts(terminating_by_preemption=True)}
    )
    assert ineligible_reason(snapshot, gm, waiting) == TERMINATING_MESSAGE
    assert ineligible_reason(snapshot, gm, Inputs(nominated=[(gm[1], "n0")])) is None


def test_budgets_are_reprieved_first() -> None:
    # The singles are cheaper (priority 1 like the gang's, but one unit each); a budget
    # that allows no disruption of them makes the gang go instead.
    placed, snapshot = full_cluster()
    budget = PodDisruptionBudget.from_api(
        {
            "metadata": {"name": "b", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"keep": "yes"}}},
            "status": {"disruptionsAllowed": 0},
        }
    )
    placed = [
        (pod(p.name, "2", p.priority, keep="yes") if p.name.startswith("s-") else p, n)
        for p, n in placed
    ]
    snapshot = cluster([make_node(f"n{i}", cpu="4") for i in range(4)], placed)
    inputs = with_gangs(placed, {"default/lo": [f"lo-{i}" for i in range(4)]}, pdbs=[budget])
    found = run(snapshot, members(4), inputs)
    assert victims(found) == [f"lo-{i}" for i in range(4)]
    assert found is not None
    assert found.pdb_violations == 0


def test_own_placed_members_and_pending_members_are_never_victims() -> None:
    # A partial gang: hi-0 already placed on n0 (same gang), 3 more pending.
    placed, _ = full_cluster()
    own = pod("hi-0", "2", 1)  # even of a lower priority than the pending members
    placed = [(p, n) for p, n in placed if p.name != "s-0"] + [(own, "n0")]
    snapshot = cluster([make_node(f"n{i}", cpu="4") for i in range(4)], placed)
    inputs = with_gangs(
        placed, {"default/g": ["hi-0"], "default/lo": [f"lo-{i}" for i in range(4)]}
    )
    units = candidate_units(framework(), snapshot, members(3), inputs, own_gang="default/g")
    assert all(p.name != "hi-0" for u in units for p in u)


def test_only_the_plans_nodes_lose_pods_and_the_search_is_bounded() -> None:
    # 8 nodes, each with four 1-cpu priority-1 pods; a gang of 2 x 4 cpu takes two whole
    # nodes: exactly 8 victims, all on the plan's two nodes.
    placed = [(pod(f"p{n}-{j}", "1", 1), f"n{n}") for n in range(8) for j in range(4)]
    snapshot = cluster([make_node(f"n{i}", cpu="4") for i in range(8)], placed)
    found = run(snapshot, members(2, cpu="4"), Inputs())
    assert found is not None
    assert len(found.nodes) == 2
    on_plan = sorted(p.name for p, node in placed if node in found.nodes)
    assert victims(found) == on_plan
    # A tiny trial budget: still correct (a fitting plan), possibly more victims, but only
    # on the plan's nodes.
    capped = preempt_gang(
        framework(),
        snapshot,
        gang(min_member=2),
        members(2, cpu="4"),
        Inputs(),
        need=2,
        solve_fn=SOLVE,
        max_trials=1,
    )
    assert capped is not None
    assert capped.plan.admitted
    assert len(capped.victims) >= 8
    assert {snapshot.node_of_pod(v.key) for v in capped.victims} <= set(capped.nodes)


def test_the_search_as_a_state_machine() -> None:
    placed, snapshot = full_cluster()
    inputs = with_gangs(placed, {"default/lo": [f"lo-{i}" for i in range(4)]})
    gm = members(4)
    units = candidate_units(framework(), snapshot, gm, inputs, own_gang="default/g")
    search = VictimSearch(units, inputs, node_lookup(snapshot))
    first = search.trial()
    assert first is not None
    assert len(first) == 8

    def failed() -> GangPlan:
        return SOLVE(problem_for(snapshot, gm))

    search.tell(failed())  # the full cluster: no fit even with everything gone (as told)
    assert search.done
    assert search.result() is None
    assert search.trial() is None


def test_of_equal_priorities_the_cheaper_of_gang_first_and_singles_first_wins() -> None:
    # Each node: a 2-cpu member of gang lo and two 1-cpu singles, all priority 1. Keeping
    # the gang would cost all eight singles; keeping the singles costs the gang's four.
    placed = [(pod(f"lo-{i}", "2", 1), f"n{i}") for i in range(4)]
    placed += [(pod(f"s-{i}-{j}", "1", 1), f"n{i}") for i in range(4) for j in range(2)]
    snapshot = cluster([make_node(f"n{i}", cpu="4") for i in range(4)], placed)
    inputs = with_gangs(placed, {"default/lo": [f"lo-{i}" for i in range(4)]})
    found = run(snapshot, members(4), inputs)
    assert victims(found) == [f"lo-{i}" for i in range(4)]
    # Three members: three nodes' singles (6 pods) or the gang (4 pods): still the gang.
    assert victims(run(snapshot, members(3), inputs)) == [f"lo-{i}" for i in range(4)]
    # One member: two singles of one node beat the gang's four.
    one = run(snapshot, members(1), inputs)
    assert one is not None
    assert len(one.victims) == 2
    assert all(v.name.startswith("s-") for v in one.victims)


def test_a_lower_priority_holder_of_a_members_read_write_once_pod_claim_is_a_victim() -> None:
    # hi-0 mounts the ReadWriteOncePod claim "solo" that lo (priority 1) holds on n0; the
    # nodes have room, so only the claim stands in the way.
    holder = claimant("lo", 1, "solo")
    placed = [(holder, "n0"), (pod("s-0", "1", 1), "n0"), (pod("s-1", "1", 1), "n1")]
    snapshot = cluster([make_node("n0", cpu="4"), make_node("n1", cpu="4")], placed)
    volumes = storage(placed)
    gm = [claimant("hi-0", 100, "solo"), pod("hi-1", "1", 100)]
    found = run(snapshot, gm, Inputs(volumes=volumes))
    assert victims(found) == ["lo"]
    assert volumes.claim_in_use("default", "solo")  # the search put the holder back
    # A holder of the gang's priority keeps its claim: nothing helps.
    higher = [(claimant("lo", 100, "solo"), "n0"), *placed[1:]]
    snapshot = cluster([make_node("n0", cpu="4"), make_node("n1", cpu="4")], higher)
    assert run(snapshot, gm, Inputs(volumes=storage(higher))) is None


def timing_out(
    when: Callable[[int], bool],
) -> tuple[Callable[[GangProblem], GangPlan], list[int]]:
    """:data:`SOLVE`, except that the calls ``when`` picks (counted from 1) run out of time
    (``TIMEOUT_REJECTED``, no plan), as a big gang's solve does under a short limit. Also
    returns the list of calls that timed out."""
    calls: list[int] = []
    timed_out: list[int] = []

    def solve_fn(problem: GangProblem) -> GangPlan:
        calls.append(1)
        if not when(len(calls)):
            return SOLVE(problem)
        timed_out.append(len(calls))
        return GangPlan(
            status=SolveStatus.TIMEOUT_REJECTED,
            placements=(),
            admitted=False,
            message="timed out",
            solve_time_s=1.0,
            members=problem.reports,
            need=problem.need,
        )

    return solve_fn, timed_out


def two_small_or_one_big() -> Snapshot:
    """n0 (2 cpu) holds x and y (1 cpu each), n1 (2 cpu) holds z (2 cpu), all priority 1:
    a 2-cpu member needs x and y gone, or z alone (fewer victims)."""
    placed = [(pod("x", "1", 1), "n0"), (pod("y", "1", 1), "n0"), (pod("z", "2", 1), "n1")]
    return cluster([make_node("n0", cpu="2"), make_node("n1", cpu="2")], placed)


def test_a_reprieve_that_times_out_spares_its_unit() -> None:
    snapshot = two_small_or_one_big()
    solve_fn, timed_out = timing_out(lambda call: call == 2)
    found = preempt_gang(
        framework(), snapshot, gang(), members(1), Inputs(), need=1, solve_fn=solve_fn
    )
    # The plan with everything gone uses n0; putting x back needs a solve, which times out:
    # x is spared (it is not needed: z's node will do), and a later solve settles on n1.
    assert timed_out == [2]
    assert victims(found) == ["z"]
    assert found is not None
    assert found.nodes == ("n1",)


def test_when_every_reprieve_times_out_nothing_is_evicted() -> None:
    snapshot = two_small_or_one_big()
    solve_fn, timed_out = timing_out(lambda call: call > 1)
    found = preempt_gang(
        framework(), snapshot, gang(), members(1), Inputs(), need=1, solve_fn=solve_fn
    )
    # Every solve after the first runs out: each spares its unit, and no plan for what is
    # left is found in time, so nothing is evicted (never x, y and z for want of time).
    assert len(timed_out) >= 2
    assert found is None

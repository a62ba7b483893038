"""Plans are handed to the commit in an order it can re-check one member at a time.

The model holds spread on the final counts; the commit asks the framework about one member
at a time with those before it placed, as kube would. These cases are valid plans whose
member order (classes laid on their nodes, then sorted by member) fails that re-check.
"""

from __future__ import annotations

import numpy as np

from scheduler.solver import violations
from scheduler.solver.order import commit_order
from tests.builders import cluster, make_node
from tests.solver.support import built, member, plan_for, problem_for, replay


def test_a_spread_gang_is_committed_interleaving_its_domains() -> None:
    snapshot = cluster(
        [
            make_node("a1", cpu="64", memory="256Gi").label("zone", "a"),
            make_node("b1").label("zone", "b"),
        ]
    )
    members = built([member(f"m{i}").spread(1, "zone", {"app": "train"}) for i in range(4)])
    problem = problem_for(snapshot, members)
    a1, b1 = problem.node_names.index("a1"), problem.node_names.index("b1")
    counts = np.zeros_like(problem.limit)
    counts[0, [a1, b1]] = 2
    assert violations(problem, counts) == []
    names = problem.node_names
    in_member_order = [(0, "a1"), (1, "a1"), (2, "b1"), (3, "b1")]
    assert replay(snapshot, members, in_member_order) != [], "the premise: order matters"
    ordered = [(i, names[n]) for i, n in commit_order(problem, counts)]
    assert sorted(node for _, node in ordered) == ["a1", "a1", "b1", "b1"]
    assert sorted(i for i, _ in ordered) == [0, 1, 2, 3]
    assert replay(snapshot, members, ordered) == []


def test_two_classes_whose_member_order_would_corner_the_commit() -> None:
    """a1 holds two small members or one large, b1 two large: the only valid plan is
    small+small on a1, large+large on b1. In member order the second small member fails
    on a1 (skew 2), moves to b1, and the second large member then fits nowhere."""
    snapshot = cluster(
        [
            make_node("a1", cpu="2", memory="16Gi").label("zone", "a"),
            make_node("b1", cpu="4", memory="16Gi").label("zone", "b"),
        ]
    )
    shapes = [("y0", "1"), ("y1", "1"), ("x0", "2"), ("x1", "2")]
    members = built([member(n, cpu=cpu).spread(1, "zone", {"app": "train"}) for n, cpu in shapes])
    _, plan = plan_for(snapshot, members)
    assert plan.admitted
    assert dict(plan.placements) == {0: "a1", 1: "a1", 2: "b1", 3: "b1"}
    assert replay(snapshot, members, plan) == []

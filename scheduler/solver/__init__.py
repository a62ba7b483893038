"""Gang placement: all members of a gang on nodes at once, or none of them.

Theory of operation
-------------------
A gang is placed from one snapshot in two steps.

1. :func:`build_problem` (on the event loop) runs the framework — every filter and score,
   Topology alignment and LoadAware included — once per *class* of identical members, and
   copies out plain arrays: per class and node the score and the most members the node
   takes, free capacity, and the rules that bind members to each other (anti-affinity,
   affinity groups, spread, host ports, device exclusivity, one domain of the gang's
   topology key). A minResources pre-check rejects at once when the cluster's total free
   capacity is too small.
2. :func:`solve` (in a worker thread; it reads only the problem) runs greedy in arrival
   order, then one CP-SAT model per domain over integer per-node member counts, seeded with
   greedy's answer, within a time limit. The objective is lexicographic: members placed,
   members on nodes no preference passes over, total framework score, and finally the GPUs
   the request mix can still use afterwards (GPUPlacement's fragmentation measure). The
   gang is rejected only when the model proves that
   ``need`` members cannot be placed, or greedy fell short and the solver found nothing in
   time; greedy's answer is kept when time runs out.

A gang that does not fit may preempt (:mod:`scheduler.solver.preempt`): lower-priority
pods (a placed gang whole) are evicted only when a plan with exactly them gone places
``need`` members, and only with a pod on a node of that plan; the search puts victims back
one at a time while the gang still fits (the plan in hand, else a solve, decides; a
timeout spares the victim).

Counting members per node instead of one boolean per member and node keeps the model small
enough for thousands of nodes (:mod:`lattice_dev.solver.naive` is the boolean reference the
tests compare with; ``python -m lattice_dev.solver.bench`` prints the scaling).
"""

from scheduler.solver.check import objective, violations
from scheduler.solver.greedy import GreedyResult, greedy
from scheduler.solver.problem import GangProblem, MemberReport, build_problem
from scheduler.solver.solve import ADMITTED, GangPlan, SolveStatus, solve

__all__ = [
    "ADMITTED",
    "GangPlan",
    "GangProblem",
    "GreedyResult",
    "MemberReport",
    "SolveStatus",
    "build_problem",
    "greedy",
    "objective",
    "solve",
    "violations",
]

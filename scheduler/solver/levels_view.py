"""Per topology level, where a gang's plan puts its members and why other domains were not
taken: the view ``lattice explain --gang`` prints.

Why a view of its own: the solver's message names the required domain it chose (or the best
one short), but an operator asking "why not rack r7?" needs every domain of every level
with what it could hold against what the gang needs. The figures are the ones the planner
read (each node's room for members of the gang on its own, and its free GPUs, over the
nodes some member may use), so the view cannot disagree with the plan it explains.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scheduler.core.snapshot import Snapshot
from scheduler.model.gang import GangSpec
from scheduler.solver.problem import GangProblem, member_capacity, node_level
from scheduler.solver.solve import GangPlan


@dataclass(frozen=True, slots=True)
class DomainView:
    """One domain of a level, over the nodes some member of the gang may use."""

    name: str
    """The label value (``(unset)``: the nodes without the label, each alone)."""
    nodes: int
    room: int
    """Members of the gang its nodes can hold, each node on its own (an upper bound)."""
    gpus_free: int
    planned: int
    """Members the plan puts there."""
    verdict: str


@dataclass(frozen=True, slots=True)
class LevelView:
    key: str
    role: str
    """``required``, ``preferred``, ``slices`` (comma-joined when several), or ``""``."""
    domains: tuple[DomainView, ...]


@dataclass(frozen=True, slots=True)
class SliceView:
    index: int
    domain: str
    members: tuple[str, ...]


def level_views(
    problem: GangProblem,
    plan: GangPlan,
    snapshot: Snapshot,
    gang: GangSpec,
    levels: Sequence[str],
) -> tuple[LevelView, ...]:
    """Every configured level (widest first), then the gang's required, preferred or slice
    level if it is not one of them; domains with members planned first, then by room."""
    keys = list(levels)
    for extra in (gang.topology_key, gang.topology_preferred, gang.slice_key):
        if extra is not None and extra not in keys:
            keys.append(extra)
    if not keys or not problem.num_nodes:
        return ()
    index = np.array([snapshot.index_of(n) for n in problem.node_names], dtype=np.intp)
    capacity = (
        problem.capacity if len(problem.capacity) == problem.num_nodes else member_capacity(problem)
    )
    row = {name: n for n, name in enumerate(problem.node_names)}
    planned = np.zeros(problem.num_nodes, dtype=np.int64)
    for _, node in plan.placements:
        planned[row[node]] += 1
    need = problem.need
    gpus_needed = _gpus_needed(problem)
    out = []
    for key in keys:
        role = ", ".join(
            name
            for name, k in (
                ("required", gang.topology_key),
                ("preferred", gang.topology_preferred),
                ("slices", gang.slice_key),
            )
            if k == key
        )
        level = node_level(snapshot, key, index)
        labelled = len(level.names)
        domains: list[DomainView] = []
        unset = np.flatnonzero(level.domain >= labelled)
        for d in range(labelled):
            nodes = np.flatnonzero(level.domain == d)
            domains.append(
                _domain(
                    level.names[d],
                    nodes,
                    capacity,
                    problem,
                    planned,
                    required=role.startswith("required"),
                    need=need,
                    gpus_needed=gpus_needed,
                    key=key,
                )
            )
        if len(unset):
            domains.append(
                DomainView(
                    "(unset)",
                    len(unset),
                    int(capacity[unset].sum()),
                    int(np.maximum(problem.gpu_free[unset], 0).sum()),
                    int(planned[unset].sum()),
                    f"no {key} label" + (": no member may go there" if role else ""),
                )
            )
        domains.sort(key=lambda v: (-v.planned, -v.room, v.name))
        out.append(LevelView(key, role, tuple(domains)))
    return tuple(out)


def slice_views(problem: GangProblem, plan: GangPlan, snapshot: Snapshot) -> tuple[SliceView, ...]:
    """The plan's slices: each slice's domain (of the slice level) and its members."""
    if not plan.slices or problem.slicing is None:
        return ()
    key = problem.slicing.key
    nodes = dict(plan.placements)
    members: dict[int, list[str]] = {}
    domain: dict[int, str] = {}
    for i, k in plan.slices:
        members.setdefault(k, []).append(problem.members[i])
        node = snapshot.get_node(nodes[i]) if i in nodes else None
        value = node.labels.get(key, "(unset)") if node is not None else "(unset)"
        domain[k] = f"{key}={value}"
    return tuple(SliceView(k, domain[k], tuple(sorted(members[k]))) for k in sorted(members))


def _gpus_needed(p: GangProblem) -> int:
    """GPUs of the ``need`` members asking for the fewest (exact when members are alike)."""
    if not p.gpus.any():
        return 0
    return int(np.sort(p.gpus[list(p.member_class)])[: p.need].sum())


def _domain(
    name: str,
    nodes: np.ndarray,
    capacity: np.ndarray,
    p: GangProblem,
    planned: np.ndarray,
    *,
    required: bool,
    need: int,
    gpus_needed: int,
    key: str,
) -> DomainView:
    room = int(capacity[nodes].sum())
    gpus = int(np.maximum(p.gpu_free[nodes], 0).sum())
    members = int(planned[nodes].sum())
    if members:
        verdict = f"chosen: {members} member{'s' if members != 1 else ''}"
    elif required and (room < need or gpus < gpus_needed):
        short = []
        if room < need:
            short.append(f"holds {room} of {need} members (short {need - room})")
        if gpus < gpus_needed:
            short.append(f"{gpus} of {gpus_needed} GPUs free (short {gpus_needed - gpus})")
        verdict = f"refused: {'; '.join(short)} in one {key}"
    elif required:
        verdict = "fits; not chosen"
    else:
        verdict = "unused"
    return DomainView(name, len(nodes), room, gpus, members, verdict)

"""Members into slices (tensor-parallel groups of ``N``), each inside one domain.

The solvers only count: the members each domain of the slice level gets, with the
gang's bound members there, are a multiple of ``N`` (:func:`~scheduler.solver.check.
slice_violations`). Any such placement splits into slices of one domain each; this
module does the split. Bound members keep their slices: a short slice is completed by
new members of its domain first, the rest form new slices numbered after the highest
one in use, domain by domain, members in index order (stable for the same plan).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from scheduler.solver.problem import GangProblem


def assign_slices(problem: GangProblem, placements: Sequence[tuple[int, int]]) -> dict[int, int]:
    """Per placed member (``(member, local node)`` pairs), its slice; empty without
    slices. Raises ValueError when the placement does not split (a domain's count is not
    whole slices): the check should have refused it."""
    p = problem
    if p.slicing is None or p.slice_size <= 0:
        return {}
    size = p.slice_size
    by_domain: dict[int, list[int]] = defaultdict(list)
    for member, node in placements:
        by_domain[int(p.slicing.domain[node])].append(member)
    bound: dict[int, dict[int, int]] = defaultdict(dict)  # domain -> slice -> members
    for d, k in p.slice_bound:
        bound[d][k] = bound[d].get(k, 0) + 1
    next_slice = max((k for _, k in p.slice_bound), default=-1) + 1
    out: dict[int, int] = {}
    for d in sorted(by_domain):
        if d < 0:
            raise ValueError(f"members on nodes without {p.slicing.key}")
        todo = sorted(by_domain[d])
        for k, have in sorted(bound[d].items()):
            for _ in range(max(size - have, 0)):
                if todo:
                    out[todo.pop(0)] = k
        if len(todo) % size:
            raise ValueError(f"{p.slicing.name(d)}: {len(todo)} new members, not whole slices")
        for start in range(0, len(todo), size):
            for member in todo[start : start + size]:
                out[member] = next_slice
            next_slice += 1
    return out


__all__ = ["assign_slices"]

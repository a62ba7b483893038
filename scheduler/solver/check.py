"""The objective and the rules of a placement, stated once on final per-node counts.

A placement is a (classes, local nodes) matrix of member counts. :func:`objective` is the
value every solver here maximises (greedy, the CP-SAT count model, the naive boolean
model), so their answers compare as integers; :func:`violations` lists every rule a
placement breaks, in words, and is what the tests hold every answer to. Both are direct
restatements of the model, written independently of it on purpose.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from scheduler.core.snapshot import IntArray
from scheduler.solver.problem import GangProblem


def gpus_used(problem: GangProblem, counts: IntArray) -> IntArray:
    used: IntArray = problem.gpus @ counts if problem.num_classes else np.zeros(0, np.int64)
    return used


def whole_nodes(problem: GangProblem, counts: IntArray) -> int:
    """Fragmentation-counted nodes not left partially free of GPUs (reported in plans)."""
    if not problem.num_nodes:
        return 0
    after = problem.gpu_free - gpus_used(problem, counts)
    partial = (after > 0) & (after < problem.gpu_alloc)
    return int((problem.frag_nodes & ~partial).sum())


def kept(problem: GangProblem, counts: IntArray) -> int:
    """The objective's last tier: GPUs kept usable by the request mix (thousandths),
    summed over the nodes whose fragmentation counts."""
    if not problem.num_nodes:
        return 0
    width = problem.keep.shape[1]
    used = np.clip(gpus_used(problem, counts), 0, width - 1)
    return int(problem.keep[np.arange(problem.num_nodes), used][problem.frag_nodes].sum())


def used_domains(domain: IntArray, counts: IntArray) -> IntArray:
    """The domain ids (of a per-node ``domain`` array) where ``counts`` places members."""
    out: IntArray = np.unique(domain[counts.sum(axis=0) > 0])
    return out[out >= 0]


def spans(problem: GangProblem, counts: IntArray) -> tuple[int, ...]:
    """Per level of the preferred chain (widest first), the domains the members span,
    bound members' included."""
    out = []
    for i, level in enumerate(problem.compact):
        bound = problem.spanned[i] if i < len(problem.spanned) else ()
        out.append(len(set(used_domains(level.domain, counts).tolist()) | set(bound)))
    return tuple(out)


def tight_used(problem: GangProblem, counts: IntArray) -> int:
    """The tight ranks of the domains used (lower: fuller domains, BestFit)."""
    if problem.tight is None:
        return 0
    used = set(used_domains(problem.tight.domain, counts).tolist()) | set(problem.tight_spanned)
    return int(sum(int(problem.tight_rank[d]) for d in used))


def kept_whole(problem: GangProblem, counts: IntArray) -> int:
    """Empty domains below the tight level the placement leaves untouched or fills."""
    total = 0
    if not problem.empty:
        return 0
    used = gpus_used(problem, counts)
    for empty in problem.empty:
        per = np.bincount(empty.level.domain, weights=used, minlength=empty.level.size)
        ids = empty.ids
        total += int(((per[ids] == 0) | (per[ids] >= empty.room[ids])).sum())
    return total


def objective(problem: GangProblem, counts: IntArray) -> int:
    """Placed members, then domains left unused at the preferred level and each wider one,
    then the tight ranks left unused, then empty domains kept whole, then members in fuller
    domains (pack), then preferred placements, then score, then GPUs kept usable (every
    tier non-negative, so a placement of ``need`` members is worth at least ``need`` placed
    units)."""
    p, w = problem, problem.weights
    placed = int(counts.sum())
    preferred = int((counts * p.preferred).sum())
    score = int((counts * p.score).sum())
    pack = int((counts * p.pack).sum()) if p.pack.size else 0
    domains = sum(
        (level.size - used) * weight
        for level, used, weight in zip(p.compact, spans(p, counts), w.spans, strict=True)
    )
    tight = (int(p.tight_rank.sum()) - tight_used(p, counts)) * w.tight
    return (
        placed * w.placed
        + domains
        + tight
        + kept_whole(p, counts) * w.whole_domains
        + preferred * w.preferred
        + score * w.score
        + pack * w.pack
        + kept(p, counts) * w.whole
    )


def _per_domain(domain: IntArray, amounts: IntArray, size: int) -> IntArray:
    known = domain >= 0
    out: IntArray = np.bincount(domain[known], weights=amounts[known], minlength=size).astype(
        np.int64
    )
    return out


def violations(problem: GangProblem, counts: IntArray) -> list[str]:
    """Every rule ``counts`` breaks (empty: a valid, possibly partial, placement)."""
    p = problem
    out: list[str] = []
    if counts.shape != (p.num_classes, p.num_nodes):
        return [f"counts have shape {counts.shape}, want {(p.num_classes, p.num_nodes)}"]
    names = p.node_names
    if (counts < 0).any():
        out.append("negative counts")
    for c, n in zip(*np.nonzero(counts > p.limit), strict=True):
        out.append(f"class {c}: {counts[c, n]} on {names[n]}, limit {p.limit[c, n]}")
    for c, klass in enumerate(p.classes):
        if counts[c].sum() > klass.size:
            out.append(f"class {c}: {counts[c].sum()} placed, only {klass.size} members")
    used = p.request.T @ counts if p.resources else np.zeros((0, p.num_nodes), np.int64)
    for j, resource in enumerate(p.resources):
        over = (used[j] > 0) & (used[j] > p.free[j])
        for n in np.flatnonzero(over):
            out.append(f"{names[n]}: {used[j, n]} {resource} placed, {p.free[j, n]} free")
    total = counts.sum(axis=0)
    for n in np.flatnonzero((total > 0) & (total > p.free_pods)):
        out.append(f"{names[n]}: {total[n]} pods placed, {p.free_pods[n]} slots")
    for a, b in zip(*np.nonzero(np.triu(p.port_conflicts)), strict=True):
        clash = counts[a] > 1 if a == b else (counts[a] > 0) & (counts[b] > 0)
        for n in np.flatnonzero(clash):
            out.append(f"{names[n]}: host ports of classes {a} and {b} clash")
    for rule in p.anti:
        size = int(rule.domain.max(initial=-1)) + 1
        mine = _per_domain(rule.domain, counts[rule.cls], size)
        others = [m for m in rule.matched if m != rule.cls]
        theirs = _per_domain(rule.domain, counts[others].sum(axis=0), size)
        for d in np.flatnonzero(mine > 0):
            if theirs[d] > 0 or (rule.cls in rule.matched and mine[d] > 1):
                out.append(f"anti-affinity of class {rule.cls} broken in {rule.key} domain {d}")
    for group in p.together:
        placed = counts[list(group.classes)].sum(axis=0) > 0
        domains = set(group.domain[placed].tolist())
        if len(domains) > 1 or -1 in domains:
            out.append(f"affinity group {group.classes} spans {rule_text(group.key, domains)}")
        follower = group.follower
        if (
            follower is not None
            and counts[follower].sum() > 0
            and (not group.anchors or counts[list(group.anchors)].sum() == 0)
        ):
            out.append(
                f"class {follower} placed without a member of {group.anchors} "
                "its required affinity needs"
            )
    for spread in p.spreads:
        final = spread.existing.copy()
        matched = counts[list(spread.matched)].sum(axis=0) * spread.counted
        final += _per_domain(spread.domain, matched, len(final))
        low = 0
        if not spread.min_zero and spread.eligible.any():
            low = int(final[spread.eligible].min())
        for d in set(spread.domain[counts[spread.cls] > 0].tolist()):
            if d >= 0 and final[d] - low > spread.max_skew:
                out.append(
                    f"spread of class {spread.cls} over {spread.key}: {final[d]} in domain {d}, "
                    f"min {low}, maxSkew {spread.max_skew}"
                )
    active = np.array([c.topology_active for c in p.classes], dtype=np.bool_)
    if active.any():
        users = ((counts > 0) & active[:, None]).sum(axis=0)
        for n in np.flatnonzero(p.device_exclusive & (users > 1)):
            out.append(f"{names[n]}: {users[n]} Topology-using classes share the node")
    if p.topology_key is not None:
        domains = set(p.domain[total > 0].tolist())
        if len(domains) > 1 or -1 in domains:
            out.append(f"members span {rule_text(p.topology_key, domains)}")
    out.extend(slice_violations(p, counts))
    return out


def slice_violations(problem: GangProblem, counts: IntArray) -> list[str]:
    """Slices of ``N``, each inside one domain of the slice level: every member on a
    labelled node, and the members in each domain what its bound slices are short of
    plus a multiple of ``N``, exactly when the members split into such slices."""
    p = problem
    if p.slicing is None or p.slice_size <= 0:
        return []
    out: list[str] = []
    total = counts.sum(axis=0)
    level, size = p.slicing, p.slice_size
    for n in np.flatnonzero((total > 0) & (level.domain < 0)):
        out.append(f"{p.node_names[n]}: members on a node without {level.key}")
    per = _per_domain(level.domain, total, level.size)
    short = np.zeros(level.size, dtype=np.int64)
    short[: len(p.slice_short)] = p.slice_short[: level.size]
    for d in np.flatnonzero(per < short):
        out.append(f"{level.name(int(d))}: {per[d]} members, its bound slices short of {short[d]}")
    for d in np.flatnonzero((per >= short) & ((per - short) % size != 0)):
        out.append(f"{level.name(int(d))}: {per[d]} members, not whole slices of {size}")
    return out


def rule_text(key: str, domains: set[int]) -> str:
    return f"{len(domains)} domains of {key}" + (" (some unlabelled)" if -1 in domains else "")


def slice_assignment_violations(
    problem: GangProblem, placements: Sequence[tuple[int, int]], slices: Mapping[int, int]
) -> list[str]:
    """Every way an explicit split breaks the slices: a placed member without a slice, a
    slice over two domains of the slice level, or not ``N`` members (bound ones included)."""
    p = problem
    if p.slicing is None or p.slice_size <= 0:
        return []
    out: list[str] = []
    domains: dict[int, set[int]] = {}
    sizes: dict[int, int] = {}
    for d, k in p.slice_bound:
        domains.setdefault(k, set()).add(d)
        sizes[k] = sizes.get(k, 0) + 1
    for member, node in placements:
        if member not in slices:
            out.append(f"member {member}: placed without a slice")
            continue
        k = slices[member]
        domains.setdefault(k, set()).add(int(p.slicing.domain[node]))
        sizes[k] = sizes.get(k, 0) + 1
    for k in sorted(domains):
        if len(domains[k]) > 1 or -1 in domains[k]:
            out.append(f"slice {k} spans {rule_text(p.slicing.key, domains[k])}")
        if sizes[k] != p.slice_size:
            out.append(f"slice {k}: {sizes[k]} members, not {p.slice_size}")
    return out

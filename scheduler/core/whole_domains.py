"""Whole network domains kept whole by single GPU pods, where an equal choice exists.

A rack (or block, NVLink domain: any ``spec.topology.levels`` key) whose GPUs are all free
is what the next rack-sized gang needs. A single pod that asks for GPUs and is scored
equally on a node of such a rack and on a node of a rack already in use takes the latter:
among the nodes that tie for the best total, those that would break the fewest whole
domains (counted over the levels, hostname excluded) are kept, and the seeded tie-break
picks among them as before. Scores are untouched, so a node that scores better is never
passed over for this; only a choice that kube's random tie-break would have made blindly
is made with the network in view (#37: "single pods with no constraint avoid breaking
whole domains when an equal choice exists").

Pure and vectorised: one ``bincount`` per level over the snapshot's GPU columns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from scheduler.core.snapshot import IndexArray, IntArray, Snapshot
from scheduler.model.names import LABEL_HOSTNAME


def _gpu_columns(snapshot: Snapshot, resources: Iterable[str]) -> tuple[IntArray, IntArray]:
    """Per node: GPUs allocatable and GPUs requested, over the GPU resource names."""
    n = snapshot.num_nodes
    alloc = np.zeros(n, dtype=np.int64)
    used = np.zeros(n, dtype=np.int64)
    for resource in resources:
        col = snapshot.resource_column(resource)
        if col is not None:
            alloc += snapshot.allocatable[col][:n].astype(np.int64)
            used += snapshot.requested[col][:n].astype(np.int64)
    return alloc, used


def whole_domains_broken(
    snapshot: Snapshot, levels: Sequence[str], resources: Iterable[str], rows: IndexArray
) -> IntArray:
    """Per row of ``rows``: at how many levels the node's domain has GPUs and all of them
    free (a GPU taken there breaks that whole domain). Nodes without a level's label count
    nothing at that level."""
    out = np.zeros(len(rows), dtype=np.int64)
    keys = [k for k in levels if k != LABEL_HOSTNAME]
    if not keys or not len(rows):
        return out
    alloc, used = _gpu_columns(snapshot, resources)
    n = snapshot.num_nodes
    for key in keys:
        column = snapshot.label_column(key)
        if column is None:
            continue
        ids = column.ids[:n].astype(np.int64)
        labelled = ids >= 0
        if not labelled.any():
            continue
        size = int(ids.max()) + 1
        domain_alloc = np.bincount(ids[labelled], weights=alloc[labelled], minlength=size)
        domain_used = np.bincount(ids[labelled], weights=used[labelled], minlength=size)
        whole = (domain_alloc > 0) & (domain_used == 0)
        mine = ids[rows]
        out += np.where(mine >= 0, whole[np.maximum(mine, 0)], False).astype(np.int64)
    return out


def keep_whole(
    snapshot: Snapshot, levels: Sequence[str], resources: Sequence[str], best: IndexArray
) -> IndexArray:
    """``best`` (rows tied for the best total) narrowed to those that break the fewest
    whole domains; ``best`` itself when that does not narrow it."""
    broken = whole_domains_broken(snapshot, levels, resources, best)
    if not len(broken) or int(broken.min()) == int(broken.max()):
        return best
    kept: IndexArray = best[broken == broken.min()]
    return kept

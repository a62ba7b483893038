"""Score normalisations shared by several plugins (kube's helper.DefaultNormalizeScore)."""

from __future__ import annotations

from typing import Final

import numpy as np

from scheduler.core.snapshot import BoolArray, IndexArray, IntArray

MAX_NODE_SCORE: Final = 100


def default_normalize(scores: IntArray, feasible: BoolArray, *, reverse: bool) -> IntArray:
    """Scale to 0..100 by the maximum over feasible rows; ``reverse``: fewer scores higher."""
    top = int(scores.max(where=feasible, initial=0))
    if top == 0:
        if reverse:
            return np.full(scores.shape, MAX_NODE_SCORE, dtype=np.int64)
        return scores.astype(np.int64)
    scaled: IntArray = MAX_NODE_SCORE * scores // top
    return (MAX_NODE_SCORE - scaled) if reverse else scaled


def scatter(values: list[int], rows: IndexArray, num_nodes: int) -> IntArray:
    """Place per-feasible-row values into a full-length row-aligned array."""
    out = np.zeros(num_nodes, dtype=np.int64)
    out[rows] = values
    return out

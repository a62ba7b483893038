"""The affinity graph and its DeltaGraph patches (see :mod:`scheduler.graph.affinity`).

Pure: nothing here does I/O except :mod:`scheduler.graph.cli`, which is not imported here.
"""

from scheduler.graph.affinity import AffinityGraph, Declared, TermCounts
from scheduler.graph.delta import DeltaGraph, Patch, PatchError, apply, diff, invert
from scheduler.graph.terms import TermKey

__all__ = [
    "AffinityGraph",
    "Declared",
    "DeltaGraph",
    "Patch",
    "PatchError",
    "TermCounts",
    "TermKey",
    "apply",
    "diff",
    "invert",
]

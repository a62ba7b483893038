"""NodeResourcesBalancedAllocation: prefer nodes whose resource fractions stay even.

For each scored resource the node's requested fraction (including the pod, capped at 1) is
computed; the score is ``(1 - std) * 100`` truncated, where std is half the difference for two
resources. Like PodTopologySpread's log weights and InterPodAffinity's normalisation, this uses
floats because kube-scheduler does: they only rank feasible nodes (fits are integer-exact), and
the float64 operations are done in kube-scheduler's order so scores agree bit for bit.
Pods requesting nothing skip the plugin (kube's PreScore Skip for best-effort pods).
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from scheduler.core.framework import Cycle
from scheduler.core.plugins.node_resources_fit import resource_columns
from scheduler.core.profile import BALANCED_ALLOCATION, BalancedAllocationArgs, Profile
from scheduler.core.snapshot import BoolArray, IntArray

NAME: Final = BALANCED_ALLOCATION


class BalancedAllocation:
    name: Final = NAME

    def __init__(self, args: BalancedAllocationArgs) -> None:
        self.args = args

    def score(self, cycle: Cycle, feasible: BoolArray) -> IntArray | None:
        requests = cycle.pod.resources.requests
        if all(requests.get(r, 0) == 0 for r, _ in self.args.resources):
            return None
        n = cycle.num_nodes
        fractions: list[npt.NDArray[np.float64]] = []
        valid: list[npt.NDArray[np.bool_]] = []
        for resource, _weight in self.args.resources:
            cols = resource_columns(
                cycle.snapshot, resource, requests.get(resource, 0), use_non_zero=False
            )
            if cols is None:
                continue
            alloc, used = cols
            present = alloc > 0
            divisor = alloc if present.all() else np.where(present, alloc, 1)
            fraction = used.astype(np.float64) / divisor.astype(np.float64)
            fractions.append(np.minimum(fraction, 1.0))
            valid.append(present)
        if len(fractions) < 2:
            return np.full(n, 100, dtype=np.int64)
        if len(fractions) == 2:
            std = np.abs((fractions[0] - fractions[1]) / 2)
            both = valid[0] & valid[1]
            if not both.all():
                std = np.where(both, std, 0.0)
        else:
            std = _std_many(fractions, valid)
        scores: IntArray = ((1.0 - std) * 100.0).astype(np.int64)
        return scores


def _std_many(
    fractions: list[npt.NDArray[np.float64]], valid: list[npt.NDArray[np.bool_]]
) -> npt.NDArray[np.float64]:
    """Population std over each node's valid fractions, in kube's summation order."""
    n = len(fractions[0])
    count = np.zeros(n, dtype=np.int64)
    total = np.zeros(n, dtype=np.float64)
    for f, ok in zip(fractions, valid, strict=True):
        count += ok
        total += np.where(ok, f, 0.0)
    mean = total / np.maximum(count, 1)
    acc = np.zeros(n, dtype=np.float64)
    for f, ok in zip(fractions, valid, strict=True):
        acc += np.where(ok, (f - mean) * (f - mean), 0.0)
    std = np.where(count > 2, np.sqrt(acc / np.maximum(count, 1)), 0.0)
    two = count == 2
    if two.any():
        std = np.where(two, _two_valid_std(fractions, valid), std)
    return std


def _two_valid_std(
    fractions: list[npt.NDArray[np.float64]], valid: list[npt.NDArray[np.bool_]]
) -> npt.NDArray[np.float64]:
    """|a - b| / 2 over the first two valid fractions of each node (kube's 2-resource case)."""
    first = np.full(fractions[0].shape, np.nan)
    second = np.full(fractions[0].shape, np.nan)
    for f, ok in zip(fractions, valid, strict=True):
        take_first = ok & np.isnan(first)
        take_second = ok & ~take_first & np.isnan(second)
        first = np.where(take_first, f, first)
        second = np.where(take_second, f, second)
    std: npt.NDArray[np.float64] = np.nan_to_num(np.abs((first - second) / 2))
    return std


def new(profile: Profile) -> BalancedAllocation:
    return BalancedAllocation(profile.balanced_allocation)

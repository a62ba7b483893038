"""NodeResourcesBalancedAllocation: prefer nodes whose resource fractions stay even.

For each scored resource a node's requested fraction (capped at 1) is computed, and its
balance is ``(1 - std) * 100`` truncated, where std is half the difference for two resources
and the population std for more. What is scored depends on the release mirrored
(:attr:`Profile.kube_minor`):

* 1.35 scores the balance with the pod: ``balance(with)``, within 50..100.
* 1.36 on (kubernetes#135573) scores the change the pod makes, ``50 + (50 + balance(with) -
  balance(without)) / 2`` in Go's integer arithmetic (the halving truncates toward zero),
  also within 50..100: 75 for a pod that changes nothing, towards 100 for one that evens a
  node out, towards 50 for one that tips it. "Without" is the node's plain requests (no
  non-zero defaults, like "with"), over the same resources as "with".

Like PodTopologySpread's log weights and InterPodAffinity's normalisation, this uses floats
because kube-scheduler does: they only rank feasible nodes (fits are integer-exact), and the
float64 operations are done in kube-scheduler's order so scores agree bit for bit. Resource
weights are validated but not used, as in kube. Pods requesting none of the scored resources
skip the plugin (kube's PreScore Skip for best-effort pods), in every release.
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

SCORES_CHANGE_SINCE: Final = 36
"""The first release scoring the change in balance rather than the balance with the pod."""

_MAX: Final = 100
_HALF: Final = _MAX // 2

Fractions = npt.NDArray[np.float64]


class BalancedAllocation:
    name: Final = NAME

    def __init__(self, args: BalancedAllocationArgs, *, kube_minor: int) -> None:
        self.args = args
        self.scores_change = kube_minor >= SCORES_CHANGE_SINCE

    def score(self, cycle: Cycle, feasible: BoolArray) -> IntArray | None:
        requests = cycle.pod.resources.requests
        if all(requests.get(r, 0) == 0 for r, _ in self.args.resources):
            return None
        with_pod: list[Fractions] = []
        without_pod: list[Fractions] = []
        valid: list[npt.NDArray[np.bool_]] = []
        for resource, _weight in self.args.resources:
            request = requests.get(resource, 0)
            cols = resource_columns(cycle.snapshot, resource, request, use_non_zero=False)
            if cols is None:
                continue
            alloc, used = cols
            present = alloc > 0
            divisor = (alloc if present.all() else np.where(present, alloc, 1)).astype(np.float64)
            with_pod.append(np.minimum(used.astype(np.float64) / divisor, 1.0))
            if self.scores_change:
                without_pod.append(np.minimum((used - request).astype(np.float64) / divisor, 1.0))
            valid.append(present)
        n = cycle.num_nodes
        after = _balance(with_pod, valid, n)
        if not self.scores_change:
            return after
        gain = _HALF + after - _balance(without_pod, valid, n)
        # Go's int64 division truncates toward zero; gain is never negative (both balances
        # lie within 50..100), but the sign is kept so the port holds whatever the inputs.
        scores: IntArray = _HALF + np.sign(gain) * (np.abs(gain) // 2)
        return scores


def _balance(fractions: list[Fractions], valid: list[npt.NDArray[np.bool_]], n: int) -> IntArray:
    """kube's balancedResourceScore per node: ``int64((1 - std) * 100)`` over the node's
    valid fractions (std 0 with fewer than two)."""
    if len(fractions) < 2:
        return np.full(n, _MAX, dtype=np.int64)
    if len(fractions) == 2:
        std = np.abs((fractions[0] - fractions[1]) / 2)
        both = valid[0] & valid[1]
        if not both.all():
            std = np.where(both, std, 0.0)
    else:
        std = _std_many(fractions, valid)
    scores: IntArray = ((1.0 - std) * float(_MAX)).astype(np.int64)
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
    return BalancedAllocation(profile.balanced_allocation, kube_minor=profile.kube_minor)

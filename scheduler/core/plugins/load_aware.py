"""LoadAware: keep pods off nodes that are busy now, not just full on paper.

Requests are promises; nodes run hot from pods that under-request, from other schedulers'
pods and from system daemons. This plugin reads the cycle's :class:`~scheduler.core.load.
LoadView` (the controller's EWMA predictor: smoothed measured use plus an estimate for every
pod placed since the last report; requests over allocatable for nodes whose agent is silent)
and judges each node by its utilisation *after* the incoming pod's estimate is added.

* **Filter** (off unless a threshold is set): rejects nodes whose predicted CPU or memory
  utilisation would exceed the threshold, or whose CPU/memory pressure (PSI some avg10) is
  above its threshold. Code Unschedulable: load falls, so the pod is retried.
* **Prefer** (on by default: CPU 80 %, memory 90 %): nodes that would end up above the
  preferred utilisation are ranked after every node that would not, whatever the weighted
  total says; a lexicographic rank rather than a weight, because requests-based scores see
  a node hot from foreign load as empty and can outvote any weight. Ignored when every
  feasible node is above (never makes a pod unschedulable), and skipped like the score.
* **Score** 0..100: LeastLoaded (free fraction, CPU and memory weighted) or TargetPacking
  (Trimaran's curve: fill to a target, then prefer nodes under it). Skipped when no feasible
  node has a fresh report - with nothing measured the plugin would only repeat, less well,
  what NodeResourcesFit already says about requests.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from scheduler.core.framework import (
    PREFILTER_SKIP,
    PREFILTER_SUCCESS,
    Code,
    Cycle,
    FilterResult,
    Preference,
    PreFilterResult,
)
from scheduler.core.profile import LOAD_AWARE, LoadAwareArgs, LoadScoreMode, Profile
from scheduler.core.snapshot import BoolArray, IntArray
from scheduler.model.names import CPU, MEMORY
from scheduler.predict import (
    LoadStatus,
    PodEstimate,
    PredictionBatch,
    estimate_pod,
    least_loaded_scores,
    target_packing_scores,
    threshold_verdict,
)

NAME: Final = LOAD_AWARE
_UNSCHEDULABLE: Final = np.int8(Code.UNSCHEDULABLE)


def _pct(fraction: float) -> str:
    return f"{fraction * 100:g}%"


class LoadAware:
    name: Final = NAME

    def __init__(self, args: LoadAwareArgs) -> None:
        self.args = args
        c = args.predict
        self._prefer_reasons = (
            f"predicted CPU above {_pct(c.cpu_prefer_below or 0)} while cooler nodes fit",
            f"predicted memory above {_pct(c.memory_prefer_below or 0)} while cooler nodes fit",
        )
        self._reasons = (
            f"node(s) would exceed the CPU load threshold ({_pct(c.cpu_threshold or 0)})",
            f"node(s) would exceed the memory load threshold ({_pct(c.memory_threshold or 0)})",
            "node(s) had CPU pressure",
            "node(s) had memory pressure",
        )

    def _batch(self, cycle: Cycle) -> PredictionBatch:
        view = cycle.load
        assert view is not None
        return cycle.memo("load_batch", lambda: view.batch(cycle.snapshot))

    def _estimate(self, cycle: Cycle) -> PodEstimate:
        requests = cycle.pod.resources.requests
        return estimate_pod(self.args.predict, requests.get(CPU, 0), requests.get(MEMORY, 0))

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        if cycle.load is None or not self.args.predict.filters:
            return PREFILTER_SKIP
        return PREFILTER_SUCCESS

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        c = self.args.predict
        verdict = threshold_verdict(
            self._batch(cycle),
            self._estimate(cycle),
            cpu_threshold=c.cpu_threshold,
            memory_threshold=c.memory_threshold,
            cpu_pressure_threshold=c.cpu_pressure_threshold,
            memory_pressure_threshold=c.memory_pressure_threshold,
        )
        masks = (verdict.cpu, verdict.memory, verdict.cpu_pressure, verdict.memory_pressure)
        reasons = tuple(
            (reason, mask) for reason, mask in zip(self._reasons, masks, strict=True) if mask.any()
        )
        if not reasons:
            return None
        codes = np.where(verdict.rejected, _UNSCHEDULABLE, np.int8(0)).astype(np.int8)
        return FilterResult(codes, reasons)

    def _measured(self, cycle: Cycle, feasible: BoolArray) -> PredictionBatch | None:
        """The cycle's batch when some feasible node has a fresh report, else None (without
        computing the batch when no node at all can be fresh: a cluster without agents)."""
        if cycle.load is None or not cycle.load.may_have_fresh():
            return None
        batch = self._batch(cycle)
        return batch if (batch.status[feasible] == LoadStatus.FRESH).any() else None

    def prefer(self, cycle: Cycle, feasible: BoolArray) -> Preference | None:
        c = self.args.predict
        if c.cpu_prefer_below is None and c.memory_prefer_below is None:
            return None
        batch = self._measured(cycle, feasible)
        if batch is None:
            return None
        # The filter's utilisation test at the preferred levels (its pressure checks off).
        verdict = threshold_verdict(
            batch,
            self._estimate(cycle),
            cpu_threshold=c.cpu_prefer_below,
            memory_threshold=c.memory_prefer_below,
        )
        masks = (verdict.cpu & feasible, verdict.memory & feasible)
        reasons = tuple(
            (reason, mask)
            for reason, mask in zip(self._prefer_reasons, masks, strict=True)
            if mask.any()
        )
        return Preference(reasons) if reasons else None

    def score(self, cycle: Cycle, feasible: BoolArray) -> IntArray | None:
        batch = self._measured(cycle, feasible)
        if batch is None:
            return None
        c = self.args.predict
        pod = self._estimate(cycle)
        if self.args.mode is LoadScoreMode.TARGET_PACKING:
            return target_packing_scores(
                batch,
                pod,
                cpu_target=c.cpu_target,
                memory_target=c.memory_target,
                cpu_weight=c.cpu_weight,
                memory_weight=c.memory_weight,
            )
        return least_loaded_scores(
            batch, pod, cpu_weight=c.cpu_weight, memory_weight=c.memory_weight
        )


def new(profile: Profile) -> LoadAware:
    return LoadAware(profile.load_aware)

"""Plugins timed in the shell: the core stays pure, so the scheduler wraps its plugin
instances (the same objects, so per-cycle state and the gang solver's lookups by type are
unaffected) and times each extension point while the plugin timer is on (one cycle in
ten, ``scheduler_plugin_execution_duration_seconds``)."""

from __future__ import annotations

import copy
import time
from typing import Any

from scheduler.core.framework import Code, Cycle, PluginSet
from scheduler.core.schedule import Framework
from scheduler.obs.metrics import PluginTimer

_STATUS_NAMES = {
    Code.SUCCESS: "Success",
    Code.ERROR: "Error",
    Code.UNSCHEDULABLE: "Unschedulable",
    Code.UNSCHEDULABLE_AND_UNRESOLVABLE: "UnschedulableAndUnresolvable",
    Code.SKIP: "Skip",
}


class TimedPlugin:
    """One plugin at one extension point, timed while the timer is on. The core stays
    pure: timing is wrapped around its plugins here, in the shell."""

    def __init__(self, inner: Any, timer: PluginTimer, point: str) -> None:
        self._inner = inner
        self._timer = timer
        self._point = point
        self.name: str = inner.name

    def _run(self, method: str, *args: Any) -> Any:
        call = getattr(self._inner, method)
        if not self._timer.on:
            return call(*args)
        started = time.perf_counter()
        try:
            result = call(*args)
        except Exception:
            self._timer.observe(self.name, self._point, "Error", time.perf_counter() - started)
            raise
        elapsed = time.perf_counter() - started
        self._timer.observe(self.name, self._point, self._status(result, args), elapsed)
        return result

    def _status(self, result: Any, args: tuple[Any, ...]) -> str:
        if self._point == "PreFilter":
            return _STATUS_NAMES[result.code]
        if result is None:
            return "Skip" if self._point == "Score" else "Success"
        if self._point == "Filter":
            candidates = args[1]
            codes = result.codes[candidates]
            return _STATUS_NAMES[Code(int(codes.max()))] if codes.size else "Success"
        return "Success"

    def pre_filter(self, cycle: Cycle) -> Any:
        return self._run("pre_filter", cycle)

    def filter(self, cycle: Cycle, candidates: Any) -> Any:
        return self._run("filter", cycle, candidates)

    def score(self, cycle: Cycle, feasible: Any) -> Any:
        return self._run("score", cycle, feasible)

    def prefer(self, cycle: Cycle, feasible: Any) -> Any:
        return self._run("prefer", cycle, feasible)

    def annotate(self, cycle: Cycle, row: int) -> Any:
        return self._run("annotate", cycle, row)


def timed(framework: Framework, timer: PluginTimer) -> Framework:
    """A framework running ``framework``'s plugin instances, each timed by ``timer``."""
    plugins = framework.plugins
    out = copy.copy(framework)
    out.plugins = PluginSet(
        pre_filters=tuple(TimedPlugin(p, timer, "PreFilter") for p in plugins.pre_filters),
        filters=tuple(TimedPlugin(p, timer, "Filter") for p in plugins.filters),
        scores=tuple((TimedPlugin(p, timer, "Score"), w) for p, w in plugins.scores),
        annotators=tuple(TimedPlugin(p, timer, "Annotate") for p in plugins.annotators),
        preferences=tuple(TimedPlugin(p, timer, "Prefer") for p in plugins.preferences),
        volume_planners=plugins.volume_planners,
        claim_planners=plugins.claim_planners,
    )
    return out
